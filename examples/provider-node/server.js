'use strict';
// A minimal day-one checkfu sandbox provider, written from the author kit alone
// (`checkfu kit export`): the HTTP wire form of the lifecycle members, Node's standard
// library only.
//
//   PORT=8123 CHECKFU_PROVIDER_CREDENTIAL=... node examples/provider-node/server.js
//
// It serves the nine required members (describe, materialize, provision, writeFile,
// activate, exec, inspect, release, compensate) for the seed's day-one tier: one fixed
// base image (the host's own userland, read-only), container tier, network "none",
// ephemeral_zdr retention, no snapshots, no optional member. The eight optional members
// answer SandboxOperationUnsupported. See README.md beside this file.
//
// Files: decode.js decodes every request by the kit's rules (and checks every result we
// send against the kit's result schema); sandbox.js builds and destroys the isolation;
// schemas/ are the kit's schemas of the messages served.

const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');

const { Decoder, WireError, sha256hex, MAX_MESSAGE_BYTES } = require('./decode.js');
const sandbox = require('./sandbox.js');

// ---------------------------------------------------------------------------------------
// Configuration, from the environment only.

function fatal(message) {
  process.stderr.write(`provider-node: ${message}\n`);
  process.exit(2);
}

const PORT = Number(process.env.PORT);
if (!Number.isInteger(PORT) || PORT < 0 || PORT > 65535 || process.env.PORT === undefined) fatal('PORT must be a port number');

// The credential issued at enrollment: 1 to 4096 printable characters, no spaces. We keep
// only its SHA-256 (so the comparison below is over equal lengths) and take it out of our
// environment, so no child could ever inherit it.
const CREDENTIAL = process.env.CHECKFU_PROVIDER_CREDENTIAL;
if (typeof CREDENTIAL !== 'string' || !/^[\x21-\x7e]{1,4096}$/.test(CREDENTIAL)) {
  fatal('CHECKFU_PROVIDER_CREDENTIAL must be 1 to 4096 printable characters without spaces');
}
const CREDENTIAL_HASH = crypto.createHash('sha256').update(CREDENTIAL).digest();
delete process.env.CHECKFU_PROVIDER_CREDENTIAL;

const why = sandbox.preflight();
if (why) fatal(`cannot isolate sandboxes here: ${why}`);

const ARCH = { x64: 'amd64', arm64: 'arm64' }[process.arch];
if (!ARCH) fatal(`no checkfu platform for the architecture ${process.arch}`);

const decoder = new Decoder(path.join(__dirname, 'schemas'));

// ---------------------------------------------------------------------------------------
// The capability envelope: the day-one tier, stated as it is. Each enforcement axis says
// who realizes it here; nothing is runner_enforced (we are not the runner).

// The one fixed base image: the host's userland, read-only. Its reference is a digest of
// a stable name, not of bytes: the userland is whatever the host has (see README.md).
const BASE_IMAGE = 'sha256:' + sha256hex('node-day-one host userland');

const TARGET = {
  provider: 'node-day-one',
  provider_revision: 'node-day-one 0.1.0',
  materialization_revision: 'node-day-one host-userland 1',
  placement: 'local',
};

const ENVELOPE = {
  ...TARGET,
  tiers: ['container'],
  platforms: [{ os: 'linux', architecture: ARCH }],
  image_mode: 'fixed',
  fixed_base_images: [BASE_IMAGE],
  package_managers: [],
  network_modes: ['none'],
  retention_modes: ['ephemeral_zdr'],
  snapshots: false,
  snapshot_custody: 'runner',
  enforcement: {
    sandbox_isolation: 'provider_attested', // mount, PID, network, IPC and UTS namespaces and a chroot; no user namespace, no seccomp
    root_read_only: 'provider_attested', // the root is a tmpfs remounted read-only, /usr bound read-only
    non_root: 'provider_attested', // every command runs as uid/gid 65534 (setpriv)
    no_new_privileges: 'provider_attested', // setpriv --no-new-privs
    capabilities_dropped: 'provider_attested', // empty bounding, inheritable, permitted and effective sets
    mounts_sealed: 'provider_attested', // each staged mount is a read-only bind mount
    disk_limit: 'provider_attested', // /tmp, the one writable place, is a tmpfs of disk_mib
    network_policy: 'provider_attested', // a network namespace holding only loopback
    resource_limits: 'not_enforced', // no cgroup: cpu, memory and pids are not limited
  },
  egress_certification: 'unsupported',
  list_dir: false,
  minimum_resources: { cpu_millis: 100, memory_mib: 64, disk_mib: 16, pids: 16 },
  maximum_resources: { cpu_millis: 4000, memory_mib: 4096, disk_mib: 1024, pids: 4096 },
  max_mounts: 8,
  operations: [],
  lifecycle_assurances: {
    release_destroys: true, // release kills the namespaces and removes the directory
    release_idempotent: true, // a second release answers the same identity (across restarts too: see release)
    reaps_process_tree: true, // nothing an exec starts outlives it (its PID namespace dies), and release kills any exec still running
    cold_compensation: true, // compensate finds an allocation by its labeled directory and processes, with no record of it
    enumerates_allocations: false, // listAllocations is not served
  },
  user_namespace: false,
};
// our own envelope must decode under the kit's rules, or we do not start
try {
  decoder.decodeValue('SandboxProviderCapabilities', structuredClone(ENVELOPE));
} catch (e) {
  fatal(`our own envelope does not decode: ${e.code} ${e.field}: ${e.message}`);
}

// The members: the nine we serve, and the eight optional ones we do not declare.
const SERVED = ['describe', 'materialize', 'provision', 'writeFile', 'activate', 'exec', 'inspect', 'release', 'compensate'];
const NOT_SERVED = ['openProcess', 'readFiles', 'listAllocations', 'listDir', 'snapshot', 'deleteSnapshot', 'clone', 'resume'];
const REQUEST = {
  describe: 'DescribeRequest', materialize: 'MaterializeRequest', provision: 'ProvisionRequest',
  writeFile: 'WriteFileRequest', activate: 'ActivateRequest', exec: 'ExecRequest',
  inspect: 'InspectRequest', release: 'ReleaseRequest', compensate: 'CompensateRequest',
};
const RESULT = {
  describe: 'DescribeResult', materialize: 'MaterializeResult', provision: 'InstanceResult',
  writeFile: 'WriteFileResult', activate: 'InstanceResult', exec: 'ExecResult',
  inspect: 'InstanceResult', release: 'ReleaseResult', compensate: 'CompensateResult',
};

// ---------------------------------------------------------------------------------------
// State. In memory: every instance by id (released ones stay as a small tombstone so a
// second release and inspect answer). On disk: one directory per allocation under
// STATE_DIR, the label compensate() works from. STATE_DIR exists only while it holds one.

// set once we listen: $CHECKFU_NODE_PROVIDER_STATE, or $TMPDIR/checkfu-node-provider-<port>
let STATE_DIR = null;
const instances = new Map(); // instance_id -> Instance
const byKey = new Map(); // allocation_key -> instance_id

const allocationDir = (key) => path.join(STATE_DIR, `alloc-${key}`); // keys are [A-Za-z0-9._:-], never "." or ".."
// The instance id is derived from the allocation key, so a release after a restart still
// knows the identity it released.
const instanceIdFor = (key) => 'nd-' + sha256hex(`instance\0${key}`).slice(0, 24);

function ensureStateDir() {
  fs.mkdirSync(STATE_DIR, { recursive: true, mode: 0o700 });
  const st = fs.lstatSync(STATE_DIR);
  if (!st.isDirectory() || st.uid !== process.getuid()) throw new Error(`${STATE_DIR} is not our directory`);
}

function removeStateDirIfEmpty() {
  if (STATE_DIR === null) return;
  try {
    fs.rmdirSync(STATE_DIR); // only succeeds when no allocation is left in it
  } catch {
    // not empty, or not there
  }
}

// ---------------------------------------------------------------------------------------
// Checks every member shares.

const err = (code, message, field = null, retryable = false) => new WireError(code, message, field, retryable);

function sameTarget(t) {
  return Object.keys(TARGET).every((k) => t[k] === TARGET[k]);
}

/** Every request names its execution target; one for another adapter is refused. */
function checkTarget(req) {
  if (!sameTarget(req.target)) {
    const k = Object.keys(TARGET).find((key) => req.target[key] !== TARGET[key]);
    throw err('SandboxIdentityMismatch', `this provider is ${JSON.stringify(TARGET)}, not the target asked for`, `target.${k}`);
  }
}

/** Can we serve this profile on this platform? (The runner checked it too; we check again.) */
function checkProfile(profile, platform) {
  const cap = (field, message) => err('SandboxCapabilityUnavailable', message, field);
  if (!ENVELOPE.platforms.some((p) => p.os === platform.os && p.architecture === platform.architecture)) {
    throw cap('platform.architecture', `this provider runs linux/${ARCH} only`);
  }
  if (!ENVELOPE.tiers.includes(profile.tier)) throw cap('profile.tier', `tier ${profile.tier} is not served`);
  if (!ENVELOPE.fixed_base_images.includes(profile.base_image)) throw cap('profile.base_image', `the one base image is ${BASE_IMAGE}`);
  for (const [manager, names] of Object.entries(profile.packages)) {
    if (names.length > 0) throw cap(`profile.packages.${manager}`, 'no package manager is served');
  }
  if (!ENVELOPE.network_modes.includes(profile.network_policy.mode)) throw cap('profile.network_policy.mode', 'network mode none only');
  if (!ENVELOPE.retention_modes.includes(profile.retention_mode)) throw cap('profile.retention_mode', 'ephemeral_zdr only');
  for (const d of ['cpu_millis', 'memory_mib', 'disk_mib', 'pids']) {
    const v = profile.resource_limits[d];
    if (v < ENVELOPE.minimum_resources[d] || v > ENVELOPE.maximum_resources[d]) {
      throw cap(`profile.resource_limits.${d}`, `${d} must be within ${ENVELOPE.minimum_resources[d]}..${ENVELOPE.maximum_resources[d]}`);
    }
  }
}

/** The instance a request names, checked against the allocation key and the lease. */
function findInstance(req) {
  const inst = instances.get(req.instance_id);
  if (!inst) throw err('SandboxNotFound', `no instance ${req.instance_id}`, 'instance_id');
  if (inst.allocationKey !== req.allocation_key) {
    throw err('SandboxIdentityMismatch', `instance ${req.instance_id} belongs to another allocation key`, 'allocation_key');
  }
  // A lease we have seen at a higher epoch fences the older one.
  const seen = inst.leases.get(req.lease.lease_id);
  if (seen !== undefined && req.lease.lease_epoch < seen) {
    throw err('SandboxLeaseFenced', `lease ${req.lease.lease_id} is at epoch ${seen}`, 'lease.lease_epoch');
  }
  inst.leases.set(req.lease.lease_id, Math.max(seen ?? 0, req.lease.lease_epoch));
  return inst;
}

function requireState(inst, state, member) {
  if (inst.state !== state) {
    throw err('SandboxStateConflict', `${member} needs the instance ${state}; it is ${inst.state}`, 'instance_id');
  }
}

/** The state as the wire knows it (activating is still provisioning to the runner). */
const wireState = (inst) => (inst.state === 'activating' ? 'provisioning' : inst.state);

/** What every instance result echoes. */
function identity(req, inst) {
  return { target: { ...TARGET }, lease: req.lease, allocation_key: inst.allocationKey, instance_id: inst.instanceId };
}

// ---------------------------------------------------------------------------------------
// The members. Each takes the decoded request and returns the result (or throws WireError).

const members = {
  describe() {
    return { envelope: structuredClone(ENVELOPE) };
  },

  materialize(req) {
    checkTarget(req);
    checkProfile(req.profile, req.platform);
    // image_mode fixed: nothing to build; the image is the profile's (one fixed) base image
    return {
      target: { ...TARGET },
      lease: req.lease,
      profile_digest: req.profile_digest,
      image: req.profile.base_image,
      materialization_revision: TARGET.materialization_revision,
      built: false,
    };
  },

  provision(req) {
    checkTarget(req);
    checkProfile(req.profile, req.platform);
    if (req.root_image !== req.profile.base_image) {
      throw err('SandboxCapabilityUnavailable', `root_image must be what materialize returned, ${req.profile.base_image}`, 'root_image');
    }
    if (req.mounts.length > ENVELOPE.max_mounts) {
      throw err('SandboxCapabilityUnavailable', `at most ${ENVELOPE.max_mounts} mounts`, 'mounts');
    }
    req.mounts.forEach((m, k) => {
      if (sandbox.isReserved(m.target)) {
        throw err('SandboxPathRejected', `${m.target} is where the sandbox's own userland lives`, `mounts.${k}.target`);
      }
    });

    const existing = byKey.get(req.allocation_key);
    if (existing !== undefined) {
      // the same provision again (a retry) gets the same instance; anything else is a conflict
      const inst = instances.get(existing);
      if (inst.state === 'provisioning' && inst.fingerprint === fingerprint(req)) return { ...identity(req, inst), state: inst.state };
      throw err('SandboxStateConflict', `allocation key ${req.allocation_key} is already used`, 'allocation_key');
    }

    const dir = allocationDir(req.allocation_key);
    if (fs.existsSync(dir)) {
      throw err('SandboxStateConflict', `allocation key ${req.allocation_key} still holds an allocation; compensate it first`, 'allocation_key');
    }
    const inst = {
      instanceId: instanceIdFor(req.allocation_key),
      allocationKey: req.allocation_key,
      runnerTag: req.runner_tag,
      dir,
      state: 'provisioning',
      mounts: req.mounts,
      diskMib: req.profile.resource_limits.disk_mib,
      fingerprint: fingerprint(req),
      staged: new Set(), // absolute paths written so far
      leases: new Map([[req.lease.lease_id, req.lease.lease_epoch]]),
      holder: null,
      activation: null, // the holder starting, while activate runs
      execs: new Set(),
    };
    // the label first: from here on compensate(allocation_key) finds whatever exists
    ensureStateDir();
    instances.set(inst.instanceId, inst);
    byKey.set(inst.allocationKey, inst.instanceId);
    sandbox.createInstanceDir(dir, { allocation_key: inst.allocationKey, runner_tag: inst.runnerTag, instance_id: inst.instanceId }, req.mounts);
    return { ...identity(req, inst), state: inst.state };
  },

  // writeFile is served by serveWriteFile below: its body is the file's bytes

  async activate(req) {
    checkTarget(req);
    const inst = findInstance(req);
    if (inst.activation) await inst.activation.catch(() => {}); // one activation at a time
    if (inst.state === 'active') return { ...identity(req, inst), state: inst.state }; // a retry
    requireState(inst, 'provisioning', 'activate');
    // every file of every mount plan must have been staged: the sandbox sees the plan, whole
    inst.mounts.forEach((m, k) =>
      m.files.forEach((f, i) => {
        if (!inst.staged.has(`${m.target}/${f.path}`)) {
          throw err('SandboxStateConflict', `${m.target}/${f.path} was never written`, `mounts.${k}.files.${i}.path`);
        }
      }),
    );
    // "activating": no writeFile from here on (the staged directories are bound live)
    inst.state = 'activating';
    inst.activation = sandbox.startHolder(inst.dir, inst.mounts, inst.diskMib);
    try {
      inst.holder = await inst.activation;
    } catch (e) {
      if (inst.state === 'activating') inst.state = 'provisioning';
      throw err('SandboxProviderFailed', `the sandbox could not be built: ${e.message}`);
    } finally {
      inst.activation = null;
    }
    if (inst.state !== 'activating') {
      // released or compensated while it came up
      sandbox.killGroup(inst.holder);
      throw err('SandboxStateConflict', `the instance was ${inst.state} while it activated`, 'instance_id');
    }
    inst.holder.on('exit', () => {
      if (inst.state === 'active') inst.state = 'broken';
    });
    inst.state = 'active';
    return { ...identity(req, inst), state: inst.state };
  },

  async exec(req) {
    checkTarget(req);
    const inst = findInstance(req);
    if (inst.state === 'broken') throw err('SandboxProviderFailed', 'the sandbox died', 'instance_id');
    requireState(inst, 'active', 'exec');
    // A result is one message of at most 64 MiB, and base64 grows bytes by 4/3: each
    // stream keeps at most 24 MiB, whatever max_output_bytes allows.
    const cap = Math.min(req.max_output_bytes, 24 * 1024 * 1024);
    let child;
    const r = await sandbox.runExec(inst.dir, inst.holder.pid, req, cap, (c) => {
      child = c;
      inst.execs.add(c);
    }).finally(() => inst.execs.delete(child));
    if (inst.state !== 'active') throw err('SandboxStateConflict', `the instance was ${inst.state} while the command ran`, 'instance_id');
    return {
      ...identity(req, inst),
      exit_code: r.exitCode,
      timed_out: r.timedOut,
      stdout: r.stdout.toString('base64'),
      stderr: r.stderr.toString('base64'),
      stdout_truncated: r.stdoutTruncated,
      stderr_truncated: r.stderrTruncated,
    };
  },

  inspect(req) {
    checkTarget(req);
    const inst = findInstance(req);
    if (inst.state === 'broken') throw err('SandboxProviderFailed', 'the sandbox died', 'instance_id');
    return { ...identity(req, inst), state: wireState(inst) };
  },

  async release(req) {
    checkTarget(req);
    let inst = instances.get(req.instance_id);
    if (!inst) {
      // No record (released and compensated, or a provider restart): an id we would have
      // given this allocation key is released by reclaiming whatever the key still labels.
      if (req.instance_id !== instanceIdFor(req.allocation_key)) throw err('SandboxNotFound', `no instance ${req.instance_id}`, 'instance_id');
      await sandbox.reclaim(allocationDir(req.allocation_key));
      removeStateDirIfEmpty();
      return { target: { ...TARGET }, lease: req.lease, allocation_key: req.allocation_key, instance_id: req.instance_id, state: 'released', destroyed: true };
    }
    inst = findInstance(req);
    await destroy(inst);
    inst.state = 'released';
    return { ...identity(req, inst), state: 'released', destroyed: true };
  },

  async compensate(req) {
    checkTarget(req);
    const dir = allocationDir(req.allocation_key);
    // whose is it? our record if we have one, else the label on disk
    let owner = null;
    const id = byKey.get(req.allocation_key);
    if (id !== undefined) owner = instances.get(id).runnerTag;
    else {
      try {
        owner = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8')).runner_tag;
      } catch {
        owner = null; // no label (or half a label): whatever the key names is reclaimed
      }
    }
    if (owner !== null && owner !== req.runner_tag) {
      throw err('SandboxStateConflict', `allocation ${req.allocation_key} belongs to another runner`, 'runner_tag');
    }
    let reclaimed = 0;
    if (id !== undefined) {
      const inst = instances.get(id);
      if (inst.state !== 'released') reclaimed += await destroy(inst);
      instances.delete(id);
      byKey.delete(req.allocation_key);
    }
    reclaimed += await sandbox.reclaim(dir); // whatever is left, known or not
    removeStateDirIfEmpty();
    return { target: { ...TARGET }, lease: req.lease, allocation_key: req.allocation_key, reclaimed };
  },
};

/** What makes two provision requests the same request (for a retried provision). */
function fingerprint(req) {
  return JSON.stringify([req.profile_digest, req.platform, req.runner_tag, req.root_image, req.mounts]);
}

/** Destroy an instance: its processes and namespaces, then its directory. */
async function destroy(inst) {
  inst.state = 'released';
  let n = 0;
  for (const c of inst.execs) sandbox.killGroup(c);
  if (inst.holder) sandbox.killGroup(inst.holder);
  n += await sandbox.reclaim(inst.dir);
  removeStateDirIfEmpty();
  return n;
}

// ---------------------------------------------------------------------------------------
// writeFile: the request is JSON in the Checkfu-Request header, the body is the bytes.

async function serveWriteFile(httpReq) {
  const header = httpReq.headers['checkfu-request'];
  if (header === undefined) throw err('SandboxProtocolViolation', 'writeFile carries its request in the Checkfu-Request header', 'Checkfu-Request');
  if (!/^[\x20-\x7e]*$/.test(header)) throw err('SandboxProtocolViolation', 'the Checkfu-Request header is one line of ASCII JSON', 'Checkfu-Request');
  if (mediaType(httpReq) !== 'application/octet-stream') {
    throw err('SandboxProtocolViolation', 'a writeFile body is application/octet-stream', 'Content-Type');
  }
  const req = decoder.decode('WriteFileRequest', Buffer.from(header, 'latin1'));
  checkTarget(req);
  const inst = findInstance(req);
  requireState(inst, 'provisioning', 'writeFile');

  // the path must be a file of one of the instance's mount plans
  const k = inst.mounts.findIndex((m) => req.path.startsWith(m.target + '/'));
  if (k === -1) throw err('SandboxPathRejected', `${req.path} is below no mount target`, 'path');
  const rel = req.path.slice(inst.mounts[k].target.length + 1);
  const planned = inst.mounts[k].files.find((f) => f.path === rel);
  if (!planned) throw err('SandboxPathRejected', `${req.path} is not a file of the mount plan`, 'path');
  if (planned.size !== req.size) throw err('SandboxDigestMismatch', `the plan says ${planned.size} bytes`, 'size');
  if (planned.digest.startsWith('sha256:') && planned.digest !== req.digest) throw err('SandboxDigestMismatch', 'the plan names another digest', 'digest');

  // the bytes: streamed to incoming/, hashed as they come, checked, then moved into place
  const tmp = path.join(inst.dir, 'incoming', crypto.randomBytes(8).toString('hex'));
  const sha256 = crypto.createHash('sha256');
  const git = planned.digest.startsWith('git:') ? crypto.createHash(planned.digest.length === 44 ? 'sha1' : 'sha256') : null;
  if (git) git.update(`blob ${req.size}\0`);
  let count = 0;
  const out = fs.createWriteStream(tmp, { mode: 0o600 });
  try {
    for await (const chunk of httpReq) {
      count += chunk.length;
      if (count > req.size) throw err('SandboxDigestMismatch', `more than the ${req.size} bytes stated`, 'size');
      sha256.update(chunk);
      if (git) git.update(chunk);
      if (!out.write(chunk)) await new Promise((r) => out.once('drain', r));
    }
    await new Promise((resolve, reject) => out.end((e) => (e ? reject(e) : resolve())));
    if (count !== req.size) throw err('SandboxDigestMismatch', `${count} bytes, not the ${req.size} stated`, 'size');
    if ('sha256:' + sha256.digest('hex') !== req.digest) throw err('SandboxDigestMismatch', 'the bytes do not have the stated digest', 'digest');
    if (git && 'git:' + git.digest('hex') !== planned.digest) throw err('SandboxDigestMismatch', "the bytes are not the plan's Git blob", 'digest');
    if (inst.state !== 'provisioning') throw err('SandboxStateConflict', `the instance is ${inst.state}`, 'instance_id');
    sandbox.stageFile(inst.dir, tmp, req.path, req.mode);
  } catch (e) {
    out.destroy();
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  inst.staged.add(req.path);
  return { ...identity(req, inst), path: req.path, size: req.size, digest: req.digest };
}

// ---------------------------------------------------------------------------------------
// HTTP: routing, the credential, bodies, errors.

const STATUS = {
  SandboxProtocolViolation: 400, SandboxUnauthenticated: 401, SandboxEnrollmentRefused: 403,
  SandboxNotFound: 404, SandboxLeaseFenced: 409, SandboxStateConflict: 409, SandboxBoundExceeded: 413,
  SandboxCapabilityUnavailable: 422, SandboxDigestMismatch: 422, SandboxEnvelopeInvalid: 422,
  SandboxIdentityMismatch: 422, SandboxPathRejected: 422, SandboxProfileInvalid: 422,
  SandboxAdapterAmbiguous: 500, SandboxProviderFailed: 500, SandboxResultInvalid: 500,
  SandboxOperationUnsupported: 501, SandboxAdapterUnavailable: 503, SandboxProviderTimeout: 504,
};

function errorBody(e) {
  const body = { error: { code: e.code, message: String(e.message).slice(0, 65536), retryable: Boolean(e.retryable) } };
  if (e.field !== null && e.field !== undefined) body.error.field = e.field;
  return body;
}

function send(res, status, body, headers = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

function sendError(res, e, headers = {}, status = undefined) {
  if (!(e instanceof WireError)) {
    log(`internal error: ${e && e.stack}`);
    e = err('SandboxProviderFailed', 'the provider failed');
  }
  status = status || STATUS[e.code] || 500;
  if (status === 500 && e.retryable) status = 503; // a retryable error that would be 500
  send(res, status, errorBody(e), headers);
}

/** Authorization: Bearer <credential>, compared in constant time (over SHA-256 digests). */
function authorized(httpReq) {
  const m = /^Bearer ([\x21-\x7e]{1,4096})$/i.exec(httpReq.headers.authorization || '');
  if (!m) return false;
  const given = crypto.createHash('sha256').update(m[1]).digest();
  return crypto.timingSafeEqual(given, CREDENTIAL_HASH);
}

const mediaType = (httpReq) => (httpReq.headers['content-type'] || '').split(';')[0].trim().toLowerCase();

/** A JSON member's body, at most 64 MiB. */
async function readBody(httpReq) {
  const chunks = [];
  let size = 0;
  for await (const chunk of httpReq) {
    size += chunk.length;
    if (size > MAX_MESSAGE_BYTES) throw err('SandboxProtocolViolation', 'a body over 64 MiB', 'body');
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

async function serveMember(member, httpReq) {
  if (member === 'writeFile') return serveWriteFile(httpReq);
  const body = await readBody(httpReq);
  if (body.length > 0 && mediaType(httpReq) !== 'application/json') {
    throw err('SandboxProtocolViolation', 'a request body is application/json', 'Content-Type');
  }
  // describe takes an empty body or {}
  const text = member === 'describe' && body.length === 0 ? Buffer.from('{}') : body;
  const req = decoder.decode(REQUEST[member], text);
  return members[member](req);
}

const server = http.createServer({ maxHeaderSize: 64 * 1024 }, async (httpReq, res) => {
  const url = new URL(httpReq.url, 'http://provider');
  const p = url.pathname;
  try {
    if (p === '/openapi.json' && httpReq.method === 'GET') return send(res, 200, OPENAPI);
    if (p !== '/v1' && !p.startsWith('/v1/')) throw err('SandboxNotFound', `nothing at ${p}`, 'path');
    // the credential, before anything else is looked at
    if (!authorized(httpReq)) throw err('SandboxUnauthenticated', 'a /v1 request needs Authorization: Bearer <credential>', 'authorization');
    const member = p.slice('/v1/'.length);
    if (NOT_SERVED.includes(member)) throw err('SandboxOperationUnsupported', `${member} is not served by this provider`);
    if (httpReq.method !== 'POST') {
      // the one status that is not the code's own: 405, with Allow
      if (SERVED.includes(member)) return sendError(res, err('SandboxProtocolViolation', 'members are POST', 'method'), { Allow: 'POST' }, 405);
    }
    if (!SERVED.includes(member)) throw err('SandboxOperationUnsupported', `no member ${member}`, 'path');
    const result = await serveMember(member, httpReq);
    // a result we could not stand behind is our defect, not the runner's problem to find
    try {
      decoder.decodeValue(RESULT[member], JSON.parse(JSON.stringify(result)));
    } catch (e) {
      throw err('SandboxProviderFailed', `our ${member} result does not decode: ${e.code} ${e.field} ${e.message}`);
    }
    send(res, 200, result);
  } catch (e) {
    // an early answer leaves a body we will not read: drain it, or close the connection
    if (!httpReq.complete) {
      httpReq.resume();
      res.shouldKeepAlive = false;
    }
    sendError(res, e);
  }
});

// openProcess is a WebSocket upgrade; we do not serve it, and say so over plain HTTP
// (an upgrade anywhere else is answered as the same request without one would be).
server.on('upgrade', (httpReq, socket) => {
  const p = new URL(httpReq.url, 'http://provider').pathname;
  const member = p.slice('/v1/'.length);
  const e =
    p !== '/v1' && !p.startsWith('/v1/')
      ? err('SandboxNotFound', `nothing at ${p}`, 'path')
      : !authorized(httpReq)
        ? err('SandboxUnauthenticated', 'a /v1 request needs Authorization: Bearer <credential>', 'authorization')
        : SERVED.includes(member) || NOT_SERVED.includes(member)
          ? err('SandboxOperationUnsupported', `${member} is not served over a WebSocket by this provider`)
          : err('SandboxOperationUnsupported', `no member ${member}`, 'path');
  const text = JSON.stringify(errorBody(e));
  socket.on('error', () => {});
  socket.end(
    `HTTP/1.1 ${STATUS[e.code]} ${http.STATUS_CODES[STATUS[e.code]]}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`,
  );
});

// A small OpenAPI 3.1 document of what is served (GET /openapi.json, no credential).
const OPENAPI = {
  openapi: '3.1.0',
  info: { title: `checkfu sandbox provider ${TARGET.provider}`, version: TARGET.provider_revision },
  components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
  security: [{ bearer: [] }],
  paths: Object.fromEntries(
    SERVED.map((m) => [
      `/v1/${m}`,
      {
        post: {
          operationId: m,
          requestBody: m === 'writeFile' ? { content: { 'application/octet-stream': {} } } : { content: { 'application/json': { schema: { $ref: `urn:checkfu:v1:${REQUEST[m]}` } } } },
          responses: {
            200: { description: RESULT[m], content: { 'application/json': { schema: { $ref: `urn:checkfu:v1:${RESULT[m]}` } } } },
            default: { description: 'WireError', content: { 'application/json': { schema: { $ref: 'urn:checkfu:v1:WireError' } } } },
          },
        },
      },
    ]),
  ),
};

function log(line) {
  if (process.env.CHECKFU_NODE_PROVIDER_LOG) process.stderr.write(`provider-node: ${line}\n`);
}

// ---------------------------------------------------------------------------------------
// Start, and stop: on SIGTERM or SIGINT every instance is destroyed and the state
// directory removed (if nothing of an earlier run is left in it).

function shutdown() {
  for (const inst of instances.values()) {
    for (const c of inst.execs) sandbox.killGroup(c);
    if (inst.holder) sandbox.killGroup(inst.holder);
    if (inst.state !== 'released') sandbox.reclaimSync(inst.dir);
  }
  removeStateDirIfEmpty();
  process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

server.listen(PORT, '127.0.0.1', () => {
  STATE_DIR = path.resolve(process.env.CHECKFU_NODE_PROVIDER_STATE || path.join(os.tmpdir(), `checkfu-node-provider-${server.address().port}`));
  process.stdout.write(`provider-node: serving ${TARGET.provider} on http://127.0.0.1:${server.address().port} (state ${STATE_DIR})\n`);
});
