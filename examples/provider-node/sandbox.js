'use strict';
// The isolation: Linux namespaces and a chroot, set up with util-linux and a little sh.
// Needs root on the host (the provider is the party that creates the confinement).
//
// One instance is one directory, <state>/alloc-<allocation_key>/ (the allocation key in
// the name is the label compensate() finds it by, even after the provider lost its memory):
//   meta.json   who it belongs to (allocation key, runner tag, instance id)
//   staged/     the files the runner wrote, at their absolute sandbox paths
//   incoming/   writeFile bodies while they arrive (checked, then renamed into staged/)
//   root/       an empty directory: the sandbox's / is a tmpfs mounted here, but only
//               inside the instance's own mount namespace, so the host never sees it
//
// activate() starts the instance's "holder": `unshare --mount --net --ipc --uts` running a
// sh script that builds the root inside the new mount namespace (a small tmpfs; the host's
// /usr and its /bin, /lib... read-only; a minimal /etc written here; /dev/null and a few
// other devices; /tmp a tmpfs of the profile's disk_mib, the only writable place; each
// staged mount bound read-only at its target; then the root itself remounted read-only),
// brings up loopback (the network namespace has nothing else), and sleeps. Its namespaces
// are the instance; killing it destroys them.
//
// exec() enters the holder's namespaces (nsenter) and starts a fresh PID and mount
// namespace (unshare --pid --fork --kill-child), mounts /proc for that PID namespace,
// chroots into the root and drops to uid/gid 65534 with no capabilities, no supplementary
// groups and no_new_privs (setpriv). There a small sh is PID 1 (so that the command, PID
// 2, has ordinary signal semantics) and runs the command with exactly the request's
// environment (env -i) in the request's cwd. When PID 1 exits, the kernel kills whatever
// is left in the PID namespace: nothing an exec starts outlives it.
//
// Every host-side process we start carries the environment variable LABEL=<instance dir>
// and dies with the provider (setpriv --pdeathsig KILL), so reclaim() can find and kill
// what an instance left even when the provider restarted.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const LABEL = 'CHECKFU_NODE_PROVIDER_INSTANCE';
const SANDBOX_UID = 65534; // nobody
const SANDBOX_GID = 65534; // nogroup
const HOST_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';
const TOOLS = ['unshare', 'nsenter', 'setpriv', 'chroot', 'mount', 'ip', 'sleep', 'env', 'sh'];

// Paths the root is built from; a mount target may not be one of them or below one.
const RESERVED = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc', '/dev', '/proc', '/tmp'];
const isReserved = (target) => RESERVED.some((r) => target === r || target.startsWith(r + '/'));

// Runs in the holder, as root, inside its fresh mount/network/IPC/UTS namespaces.
// $1 root dir, $2 staged dir, $3 disk MiB, then each mount target.
const HOLDER_SCRIPT = `
set -eu
root=$1 staged=$2 disk=$3
shift 3
mount -t tmpfs -o mode=0755,size=4m,nosuid,nodev checkfu-root "$root"
mkdir "$root/usr" "$root/etc" "$root/dev" "$root/tmp" "$root/proc"
# the host userland, read-only (merged-/usr hosts have /bin etc. as links into /usr)
mount --bind -o ro,nosuid,nodev /usr "$root/usr"
for d in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"
  elif [ -d "/$d" ]; then mkdir "$root/$d"; mount --bind -o ro,nosuid,nodev "/$d" "$root/$d"
  fi
done
# a minimal /etc of our own: the host's /etc may hold credentials, so only what the
# dynamic loader (ld.so.cache) and Debian's command links (alternatives) need is bound in
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\\n' >"$root/etc/passwd"
printf 'root:x:0:\\nnogroup:x:65534:\\n' >"$root/etc/group"
printf '127.0.0.1 localhost\\n::1 localhost\\n' >"$root/etc/hosts"
if [ -f /etc/ld.so.cache ]; then : >"$root/etc/ld.so.cache"; mount --bind -o ro,nosuid,nodev /etc/ld.so.cache "$root/etc/ld.so.cache"; fi
if [ -d /etc/alternatives ]; then mkdir "$root/etc/alternatives"; mount --bind -o ro,nosuid,nodev /etc/alternatives "$root/etc/alternatives"; fi
# /dev: a few harmless devices and the usual links
for n in null zero full random urandom; do : >"$root/dev/$n"; mount --bind -o nosuid,noexec "/dev/$n" "$root/dev/$n"; done
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
# /tmp: the one writable place, as big as the profile's disk_mib
mount -t tmpfs -o mode=1777,size="$disk"m,nosuid,nodev checkfu-tmp "$root/tmp"
# each staged mount, sealed read-only at its target
for t in "$@"; do
  mkdir -p "$root$t"
  mount --bind -o ro,nosuid,nodev "$staged$t" "$root$t"
done
# and the root itself
mount -o remount,ro,nosuid,nodev "$root"
ip link set lo up
echo ready
exec sleep infinity
`;

// Runs for each exec, as root, in a new mount and PID namespace inside the holder's
// namespaces. $1 root dir, $2 cwd, then NAME=VALUE for each variable, then the argv.
const EXEC_SCRIPT = `
set -eu
root=$1
shift
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
exec /usr/sbin/chroot "$root" /usr/bin/env -i /usr/bin/setpriv \\
  --reuid=${SANDBOX_UID} --regid=${SANDBOX_GID} --clear-groups \\
  --inh-caps=-all --bounding-set=-all --no-new-privs -- \\
  /bin/sh -c 'c=$1; shift; /usr/bin/env -i -C "$c" -- "$@"; exit $?' pid1 "$@"
`;

/** Refuse to start where the isolation cannot be built. Returns a reason or null. */
function preflight() {
  if (process.getuid() !== 0) return 'the provider must run as root (it creates namespaces and mounts)';
  for (const tool of TOOLS) {
    if (!HOST_PATH.split(':').some((d) => fs.existsSync(path.join(d, tool)))) return `${tool} is not installed`;
  }
  return null;
}

/** Spawn a host-side helper: labeled, in its own process group, killed when we die. */
function spawnLabeled(dir, argv, stdio) {
  return spawn('setpriv', ['--pdeathsig', 'KILL', '--', ...argv], {
    env: { PATH: HOST_PATH, [LABEL]: dir },
    stdio,
    detached: true, // its own process group, so a timeout kills the whole group
  });
}

/** Create an instance's directory and its label. Everything after this is reclaimable. */
function createInstanceDir(dir, meta, mounts) {
  fs.mkdirSync(dir, { mode: 0o700 });
  fs.writeFileSync(path.join(dir, 'meta.json'), JSON.stringify(meta) + '\n', { mode: 0o600 });
  for (const sub of ['staged', 'incoming', 'root']) fs.mkdirSync(path.join(dir, sub), { mode: 0o755 });
  for (const m of mounts) fs.mkdirSync(path.join(dir, 'staged', m.target), { recursive: true, mode: 0o755 });
}

/** Move a checked writeFile body into place at its absolute sandbox path. */
function stageFile(dir, tmpFile, sandboxPath, mode) {
  const dest = path.join(dir, 'staged', sandboxPath);
  fs.mkdirSync(path.dirname(dest), { recursive: true, mode: 0o755 });
  fs.chownSync(tmpFile, SANDBOX_UID, SANDBOX_GID); // the sandbox user owns it, so its mode means what it says
  fs.chmodSync(tmpFile, mode);
  fs.renameSync(tmpFile, dest);
}

/** Start the holder; resolves with the child once the root is built. */
function startHolder(dir, mounts, diskMib) {
  const argv = [
    'unshare', '--mount', '--net', '--ipc', '--uts', '--propagation', 'private', '--',
    '/bin/sh', '-c', HOLDER_SCRIPT, 'checkfu-holder',
    path.join(dir, 'root'), path.join(dir, 'staged'), String(diskMib),
    ...mounts.map((m) => m.target),
  ];
  const child = spawnLabeled(dir, argv, ['ignore', 'pipe', 'pipe']);
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => fail('the sandbox did not come up within 30 s'), 30000);
    const fail = (why) => {
      clearTimeout(timer);
      killGroup(child);
      reject(new Error(`${why}: ${err.trim().slice(-2000)}`));
    };
    child.stderr.on('data', (d) => (err += d));
    child.stdout.on('data', (d) => {
      out += d;
      if (out.includes('ready\n')) {
        clearTimeout(timer);
        child.stdout.destroy();
        child.stderr.destroy();
        resolve(child);
      }
    });
    child.on('error', (e) => fail(e.message));
    child.on('exit', (code, signal) => {
      if (!out.includes('ready\n')) fail(`the sandbox setup exited (${signal || code})`);
    });
  });
}

/**
 * Run one command to completion inside an active instance. Resolves with
 * {exitCode, timedOut, stdout, stderr, stdoutTruncated, stderrTruncated}.
 * exit_code: the command's status; a command killed by signal N reports 128 + N, as a
 * shell does (the timeout's kill included: 137).
 */
function runExec(dir, holderPid, req, cap, onChild) {
  const pairs = Object.entries(req.env).map(([k, v]) => `${k}=${v}`);
  // env(1) takes the first word with "=" as a variable: a command named so goes through sh
  const argv = req.argv[0].includes('=') ? ['/bin/sh', '-c', 'exec "$@"', 'sh', ...req.argv] : req.argv;
  const child = spawnLabeled(
    dir,
    [
      'nsenter', `--target=${holderPid}`, '--mount', '--net', '--ipc', '--uts', '--',
      'unshare', '--mount', '--pid', '--fork', '--kill-child', '--propagation', 'private', '--',
      '/bin/sh', '-c', EXEC_SCRIPT, 'checkfu-exec', path.join(dir, 'root'), req.cwd || '/', ...pairs, ...argv,
    ],
    ['pipe', 'pipe', 'pipe'],
  );
  onChild(child);
  return new Promise((resolve, reject) => {
    const streams = { stdout: [], stderr: [] };
    const sizes = { stdout: 0, stderr: 0 };
    const truncated = { stdout: false, stderr: false };
    for (const name of ['stdout', 'stderr']) {
      child[name].on('data', (chunk) => {
        const room = cap - sizes[name];
        if (chunk.length > room) truncated[name] = true; // keep draining, keep nothing more
        if (room > 0) {
          const part = chunk.subarray(0, Math.min(room, chunk.length));
          streams[name].push(part);
          sizes[name] += part.length;
        }
      });
    }
    let timedOut = false;
    // setTimeout fires at once past 2^31 - 1 ms; no runner waits 24.8 days anyway
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup(child);
    }, Math.min(req.timeout_ms, 2 ** 31 - 1));
    child.stdin.on('error', () => {}); // a command that does not read its stdin is fine
    child.stdin.end(Buffer.from(req.stdin, 'base64'));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const exitCode = code !== null ? code : 128 + (os.constants.signals[signal] || 0);
      resolve({
        exitCode,
        timedOut,
        stdout: Buffer.concat(streams.stdout),
        stderr: Buffer.concat(streams.stderr),
        stdoutTruncated: truncated.stdout,
        stderrTruncated: truncated.stderr,
      });
    });
  });
}

function killGroup(child) {
  if (child && child.pid && child.exitCode === null && child.signalCode === null) {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** Every live process labeled with this instance directory. */
function labeledPids(dir) {
  const want = Buffer.from(`${LABEL}=${dir}\0`);
  const pids = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name)) continue;
    let environ;
    try {
      environ = fs.readFileSync(`/proc/${name}/environ`);
    } catch {
      continue; // gone, or a kernel thread
    }
    if (environ.indexOf(want) === 0 || environ.includes(Buffer.concat([Buffer.from('\0'), want]))) pids.push(Number(name));
  }
  return pids;
}

/**
 * Reclaim an instance from nothing but its directory: kill every process labeled with it
 * (the holder and any exec's launcher; their namespaces die with them), then remove the
 * directory. Idempotent. Returns how many objects it removed (processes and directory).
 */
async function reclaim(dir) {
  let removed = 0;
  for (let round = 0; round < 50; round++) {
    const pids = labeledPids(dir);
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
        if (round === 0) removed++;
      } catch {
        // gone meanwhile
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  if (fs.existsSync(dir)) {
    fs.rmSync(dir, { recursive: true, force: true });
    removed++;
  }
  return removed;
}

/** The same, synchronously, for the provider's own exit. */
function reclaimSync(dir) {
  for (const pid of labeledPids(dir)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
}

module.exports = {
  LABEL,
  preflight,
  isReserved,
  createInstanceDir,
  stageFile,
  startHolder,
  runExec,
  killGroup,
  labeledPids,
  reclaim,
  reclaimSync,
};
