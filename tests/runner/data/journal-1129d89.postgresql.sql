--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: allocations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.allocations (
    allocation_key character varying(128) NOT NULL,
    run_id character varying(64) NOT NULL,
    kind character varying(16) NOT NULL,
    target text NOT NULL,
    runner_tag character varying(128) NOT NULL,
    lease_id character varying(128) NOT NULL,
    state character varying(16) NOT NULL,
    object_id character varying(256),
    parent_key character varying(128),
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);


--
-- Name: enrollments; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.enrollments (
    target text NOT NULL,
    provider character varying(256) NOT NULL,
    source text NOT NULL,
    kind character varying(16) NOT NULL,
    envelope_digest character varying(80) NOT NULL,
    envelope text NOT NULL,
    ceiling text NOT NULL,
    evidence text,
    credential_path text,
    credential_fingerprint character varying(80),
    enrolled_at double precision NOT NULL
);


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    id integer NOT NULL,
    run_id character varying(64) NOT NULL,
    member character varying(32) NOT NULL,
    allocation_key character varying(128),
    started_at double precision NOT NULL,
    duration_ms double precision NOT NULL,
    outcome character varying(16) NOT NULL,
    error_code character varying(64),
    detail text
);


--
-- Name: events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.events_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.events_id_seq OWNED BY public.events.id;


--
-- Name: leases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.leases (
    lease_id character varying(128) NOT NULL,
    run_id character varying(64) NOT NULL,
    owner character varying(256) NOT NULL,
    epoch bigint NOT NULL,
    expires_at double precision NOT NULL,
    ended boolean NOT NULL
);


--
-- Name: runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.runs (
    run_id character varying(64) NOT NULL,
    runner_tag character varying(128) NOT NULL,
    target text NOT NULL,
    profile_digest character varying(80),
    command text,
    status character varying(32) NOT NULL,
    exit_code integer,
    summary text,
    created_at double precision NOT NULL,
    finished_at double precision
);


--
-- Name: events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events ALTER COLUMN id SET DEFAULT nextval('public.events_id_seq'::regclass);


--
-- Data for Name: allocations; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.allocations VALUES ('alloc-legacy-2', 'run-legacy-open', 'instance', '{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}', 'runner-legacy', 'lease-legacy-open', 'live', 'mem-1', NULL, 2000.5, 2001);


--
-- Data for Name: enrollments; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.enrollments VALUES ('{"materialization_revision":"memory-images 1","placement":"test","provider":"memory","provider_revision":"memory 1"}', 'memory', 'entry point memory', 'in_tree', 'sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', '{}', '{}', NULL, NULL, NULL, 500);


--
-- Data for Name: events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.events VALUES (1, 'run-legacy-done', 'provision', 'alloc-legacy-1', 1000.5, 1.5, 'ok', NULL, NULL);


--
-- Data for Name: leases; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.leases VALUES ('lease-legacy-open', 'run-legacy-open', 'elsewhere/1/1', 1, 2600, false);


--
-- Data for Name: runs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.runs VALUES ('run-legacy-done', 'runner-legacy', '{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}', 'sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '["echo", "[/] done"]', 'succeeded', 0, '{"phases": {"process": 0.5}}', 1000, 1001);
INSERT INTO public.runs VALUES ('run-legacy-open', 'runner-legacy', '{"provider":"memory","provider_revision":"memory 1","materialization_revision":"memory-images 1","placement":"test"}', NULL, '["sleep", "60"]', 'running', NULL, NULL, 2000, NULL);


--
-- Name: events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.events_id_seq', 1, true);


--
-- Name: allocations allocations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.allocations
    ADD CONSTRAINT allocations_pkey PRIMARY KEY (allocation_key);


--
-- Name: enrollments enrollments_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.enrollments
    ADD CONSTRAINT enrollments_pkey PRIMARY KEY (target);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: leases leases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (lease_id);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id);


--
-- Name: ix_allocations_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_allocations_run_id ON public.allocations USING btree (run_id);


--
-- Name: ix_allocations_runner_tag; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_allocations_runner_tag ON public.allocations USING btree (runner_tag);


--
-- Name: ix_allocations_state; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_allocations_state ON public.allocations USING btree (state);


--
-- Name: ix_enrollments_provider; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_enrollments_provider ON public.enrollments USING btree (provider);


--
-- Name: ix_events_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_events_run_id ON public.events USING btree (run_id);


--
-- PostgreSQL database dump complete
--


