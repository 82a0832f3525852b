BEGIN TRANSACTION;
CREATE TABLE allocations (
	allocation_key VARCHAR(128) NOT NULL, 
	run_id VARCHAR(64) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	target TEXT NOT NULL, 
	runner_tag VARCHAR(128) NOT NULL, 
	lease_id VARCHAR(128) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	object_id VARCHAR(256), 
	parent_key VARCHAR(128), 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (allocation_key)
);
INSERT INTO "allocations" VALUES('alloc-legacy-2','run-legacy-open','instance','{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}','runner-legacy','lease-legacy-open','live','mem-1',NULL,2000.5,2001.0);
CREATE TABLE enrollments (
	target TEXT NOT NULL, 
	provider VARCHAR(256) NOT NULL, 
	source TEXT NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	envelope_digest VARCHAR(80) NOT NULL, 
	envelope TEXT NOT NULL, 
	ceiling TEXT NOT NULL, 
	evidence TEXT, 
	credential_path TEXT, 
	credential_fingerprint VARCHAR(80), 
	enrolled_at FLOAT NOT NULL, 
	PRIMARY KEY (target)
);
INSERT INTO "enrollments" VALUES('{"materialization_revision":"memory-images 1","placement":"test","provider":"memory","provider_revision":"memory 1"}','memory','entry point memory','in_tree','sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb','{}','{}',NULL,NULL,NULL,500.0);
CREATE TABLE events (
	id INTEGER NOT NULL, 
	run_id VARCHAR(64) NOT NULL, 
	member VARCHAR(32) NOT NULL, 
	allocation_key VARCHAR(128), 
	started_at FLOAT NOT NULL, 
	duration_ms FLOAT NOT NULL, 
	outcome VARCHAR(16) NOT NULL, 
	error_code VARCHAR(64), 
	detail TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "events" VALUES(1,'run-legacy-done','provision','alloc-legacy-1',1000.5,1.5,'ok',NULL,NULL);
CREATE TABLE leases (
	lease_id VARCHAR(128) NOT NULL, 
	run_id VARCHAR(64) NOT NULL, 
	owner VARCHAR(256) NOT NULL, 
	epoch BIGINT NOT NULL, 
	expires_at FLOAT NOT NULL, 
	ended BOOLEAN NOT NULL, 
	PRIMARY KEY (lease_id)
);
INSERT INTO "leases" VALUES('lease-legacy-open','run-legacy-open','elsewhere/1/1',1,2600.0,0);
CREATE TABLE runs (
	run_id VARCHAR(64) NOT NULL, 
	runner_tag VARCHAR(128) NOT NULL, 
	target TEXT NOT NULL, 
	profile_digest VARCHAR(80), 
	command TEXT, 
	status VARCHAR(32) NOT NULL, 
	exit_code INTEGER, 
	summary TEXT, 
	created_at FLOAT NOT NULL, 
	finished_at FLOAT, 
	PRIMARY KEY (run_id)
);
INSERT INTO "runs" VALUES('run-legacy-done','runner-legacy','{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}','sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','["echo", "[/] done"]','succeeded',0,'{"phases": {"process": 0.5}}',1000.0,1001.0);
INSERT INTO "runs" VALUES('run-legacy-open','runner-legacy','{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}',NULL,'["sleep", "60"]','running',NULL,NULL,2000.0,NULL);
CREATE INDEX ix_allocations_runner_tag ON allocations (runner_tag);
CREATE INDEX ix_allocations_state ON allocations (state);
CREATE INDEX ix_allocations_run_id ON allocations (run_id);
CREATE INDEX ix_events_run_id ON events (run_id);
CREATE INDEX ix_enrollments_provider ON enrollments (provider);
COMMIT;
