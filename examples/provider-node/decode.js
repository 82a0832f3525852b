'use strict';
// Decoding checkfu wire messages exactly as the author kit's README says, in its order:
//   1. the JSON text rules (I-JSON: one UTF-8 value, no NaN, no duplicate key, no lone
//      surrogate escape), by a small parser of our own because JSON.parse accepts all three;
//   2. the message's JSON Schema (draft 2020-12), by a small validator of the keywords the
//      kit's schemas use, reporting the kit's error code and dotted field path;
//   3. the rules beyond the schema (integers written as integers, path byte length, a real
//      date, a mount staging each path once, mount targets apart, the profile digest);
//   4. defaults filled in.
// Node's standard library only. The schemas are the kit's own files (schemas/ beside this
// file, copied from `checkfu kit export`).

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

// ---------------------------------------------------------------------------------------
// Errors: every refusal is a vocabulary error with a code, a field (dotted path or null),
// a message and a retryable flag, which server.js turns into the wire's error body.

class WireError extends Error {
  constructor(code, message, field = null, retryable = false) {
    super(message);
    this.code = code;
    this.field = field;
    this.retryable = retryable;
  }
}

// The README's table: messages (and objects inside them, wherever they sit) that own a code
// of their own. Every other request refuses with SandboxProtocolViolation, every other
// result with SandboxResultInvalid. (index.json does not carry this table; it is in prose.)
const OWN_CODES = {
  CloneResult: 'SandboxResultInvalid',
  CompensateResult: 'SandboxResultInvalid',
  DeleteSnapshotResult: 'SandboxResultInvalid',
  DescribeResult: 'SandboxResultInvalid',
  ExecResult: 'SandboxResultInvalid',
  InstanceResult: 'SandboxResultInvalid',
  ListAllocationsResult: 'SandboxResultInvalid',
  ListDirResult: 'SandboxResultInvalid',
  MaterializeResult: 'SandboxResultInvalid',
  MountFile: 'SandboxProfileInvalid',
  MountPlan: 'SandboxProfileInvalid',
  NetworkPolicy: 'SandboxProfileInvalid',
  ProcessStarted: 'SandboxResultInvalid',
  ReadFilesHead: 'SandboxResultInvalid',
  ReadFilesResult: 'SandboxResultInvalid',
  ReleaseResult: 'SandboxResultInvalid',
  ResumeResult: 'SandboxResultInvalid',
  SandboxProfile: 'SandboxProfileInvalid',
  SandboxProviderCapabilities: 'SandboxEnvelopeInvalid',
  SnapshotResult: 'SandboxResultInvalid',
  WriteFileResult: 'SandboxResultInvalid',
};

/** The code a whole message refuses with when nothing more specific applies. */
function messageCode(name) {
  if (OWN_CODES[name]) return OWN_CODES[name];
  if (/Result$|Head$/.test(name)) return 'SandboxResultInvalid';
  return 'SandboxProtocolViolation';
}

// ---------------------------------------------------------------------------------------
// Step 1: the JSON text rules. parseIJson(bytes) returns {value, nonIntegers}: the value
// (objects have a null prototype, so a key such as "__proto__" is just a key) and the set of
// paths of numbers written with a fraction or an exponent (for rule 6, which needs the
// number as written). Any breach throws WireError(code, ..., field null).

const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
const MAX_DEPTH = 256;
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function parseIJson(input, code) {
  const refuse = (rule, why) => {
    throw new WireError(code, `the document breaks the JSON text rule ${rule}: ${why}`, null);
  };
  let text;
  if (typeof input === 'string') {
    text = input;
  } else {
    if (input.length > MAX_MESSAGE_BYTES) refuse('not-json', 'over 64 MiB');
    try {
      text = utf8.decode(input);
    } catch {
      refuse('not-json', 'not UTF-8');
    }
  }
  const nonIntegers = new Set();
  const keys = []; // the path of the value being parsed
  let i = 0;

  const ws = () => {
    while (i < text.length) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else break;
    }
  };

  const parseString = () => {
    // text[i] is the opening quote
    i++;
    let out = '';
    for (;;) {
      if (i >= text.length) refuse('not-json', 'unterminated string');
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return out;
      }
      if (c < 0x20) refuse('not-json', 'a control character inside a string');
      if (c !== 0x5c) {
        out += text[i++];
        continue;
      }
      const e = text[i + 1];
      i += 2;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const unit = readHex4();
          if (unit >= 0xd800 && unit <= 0xdbff) {
            // a high surrogate must be followed by an escaped low surrogate
            if (text[i] !== '\\' || text[i + 1] !== 'u') refuse('lone-surrogate', 'a high surrogate alone');
            i += 2;
            const low = readHex4();
            if (low < 0xdc00 || low > 0xdfff) refuse('lone-surrogate', 'a high surrogate alone');
            out += String.fromCharCode(unit, low);
          } else if (unit >= 0xdc00 && unit <= 0xdfff) {
            refuse('lone-surrogate', 'a low surrogate alone');
          } else {
            out += String.fromCharCode(unit);
          }
          break;
        }
        default:
          refuse('not-json', 'a bad escape');
      }
    }
  };

  const readHex4 = () => {
    const h = text.slice(i, i + 4);
    if (!/^[0-9A-Fa-f]{4}$/.test(h)) refuse('not-json', 'a bad \\u escape');
    i += 4;
    return parseInt(h, 16);
  };

  const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
  const parseNumber = () => {
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) refuse('not-json', 'a bad number');
    i = NUMBER.lastIndex;
    if (m[1] !== undefined || m[2] !== undefined) nonIntegers.add(JSON.stringify(keys));
    const n = Number(m[0]);
    if (!Number.isFinite(n)) refuse('nan', 'a number out of range');
    return n;
  };

  const parseValue = (depth) => {
    if (depth > MAX_DEPTH) refuse('not-json', 'nested too deeply');
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const obj = Object.create(null);
      ws();
      if (text[i] === '}') {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') refuse('not-json', 'an object key is not a string');
        const key = parseString();
        if (Object.prototype.hasOwnProperty.call(obj, key)) refuse('duplicate-key', `key ${JSON.stringify(key)} twice`);
        ws();
        if (text[i] !== ':') refuse('not-json', 'expected a colon');
        i++;
        keys.push(key);
        obj[key] = parseValue(depth + 1);
        keys.pop();
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === '}') {
          i++;
          return obj;
        }
        refuse('not-json', 'expected , or }');
      }
    }
    if (c === '[') {
      i++;
      const arr = [];
      ws();
      if (text[i] === ']') {
        i++;
        return arr;
      }
      for (;;) {
        keys.push(arr.length);
        arr.push(parseValue(depth + 1));
        keys.pop();
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === ']') {
          i++;
          return arr;
        }
        refuse('not-json', 'expected , or ]');
      }
    }
    if (c === '"') return parseString();
    if (c === '-' || (c >= '0' && c <= '9')) {
      if (text.startsWith('-Infinity', i)) refuse('nan', '-Infinity');
      return parseNumber();
    }
    for (const [word, value] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return value;
      }
    }
    if (text.startsWith('NaN', i) || text.startsWith('Infinity', i)) refuse('nan', 'NaN or Infinity');
    return refuse('not-json', 'not a JSON value');
  };

  const value = parseValue(0);
  ws();
  if (i !== text.length) refuse('not-json', 'more than one JSON value');
  return { value, nonIntegers };
}

// ---------------------------------------------------------------------------------------
// Step 2: the schema. A validator of exactly the draft 2020-12 keywords the kit uses:
// $ref (local), type, const, enum, pattern, maxLength, minimum, maximum, items, minItems,
// maxItems, uniqueItems, contains, properties, required, additionalProperties,
// patternProperties, propertyNames, allOf, anyOf, oneOf, not, if/then/else. Annotations
// (title, description, default, $comment, contentEncoding) are ignored here.
//
// It returns the first fault as {code, field, message}. The code is the one of the
// innermost message that owns the field at fault (OWN_CODES; an object's own type is its
// parent's business, what is inside it is its own), except that a fault against the path
// rule's pattern (or length) is SandboxPathRejected wherever it is.

function loadSchemas(dir) {
  const schemas = {};
  for (const file of fs.readdirSync(dir)) {
    const m = /^(.*)\.schema\.json$/.exec(file);
    if (m) schemas[m[1]] = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
  }
  return schemas;
}

const regexCache = new Map();
function regex(pattern) {
  let r = regexCache.get(pattern);
  if (!r) {
    r = new RegExp(pattern, 'u'); // ECMA-262, as JSON Schema specifies: $ is the end
    regexCache.set(pattern, r);
  }
  return r;
}

// The path rule's patterns are the ones that exclude "/" and NUL from a segment. The kit
// marks them in no other way (no format, no $comment), so this is how we recognize them.
const isPathSchema = (s) => typeof s.pattern === 'string' && s.pattern.includes('[^/\\x00');

function jsonType(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v; // 'object', 'string', 'number', 'boolean'
}

function deepEqual(a, b) {
  if (a === b) return true;
  const ta = jsonType(a);
  if (ta !== jsonType(b)) return false;
  if (ta === 'array') return a.length === b.length && a.every((x, k) => deepEqual(x, b[k]));
  if (ta === 'object') {
    const ka = Object.keys(a);
    const kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && deepEqual(a[k], b[k]));
  }
  return false;
}

class Validator {
  constructor(root, nonIntegers, ownCodes = OWN_CODES) {
    this.root = root;
    this.nonIntegers = nonIntegers;
    this.ownCodes = ownCodes;
  }

  fault(code, p, message) {
    return { code, field: p.length ? p.join('.') : null, message };
  }

  typeMatches(t, v, p) {
    const actual = jsonType(v);
    if (t === 'integer') {
      // rule 6 (integers-written-as-integers) lives here, where the type is checked:
      // 8.0 and 8e0 are numbers JavaScript cannot tell from 8, so the parser remembered them
      return actual === 'number' && Number.isInteger(v) && !this.nonIntegers.has(JSON.stringify(p));
    }
    return actual === t;
  }

  resolve(ref) {
    const m = /^#\/\$defs\/(.+)$/.exec(ref);
    if (!m || !this.root.$defs || !this.root.$defs[m[1]]) throw new Error(`unresolvable $ref ${ref}`);
    return [m[1], this.root.$defs[m[1]]];
  }

  // validate(schema, value, path, code) -> fault or null
  v(s, val, p, code) {
    if (s === true) return null;
    if (s === false) return this.fault(code, p, 'nothing is allowed here');

    if (s.$ref) {
      const [name, target] = this.resolve(s.$ref);
      if (this.ownCodes[name]) {
        // the object's own type is the owner's fault; everything inside it is its own
        if (target.type && !this.typeMatches(target.type, val, p)) {
          return this.fault(code, p, `${p.join('.') || 'the document'} has the wrong JSON type`);
        }
        const f = this.v(target, val, p, this.ownCodes[name]);
        if (f) return f;
      } else {
        const f = this.v(target, val, p, code);
        if (f) return f;
      }
    }

    if (s.anyOf) {
      if (!s.anyOf.some((b) => this.v(b, val, p, code) === null)) {
        // report the fault of the one branch of the value's type, if there is one
        const same = s.anyOf.filter((b) => !b.type || this.typeMatches(b.type, val, p));
        if (same.length === 1) return this.v(same[0], val, p, code);
        return this.fault(code, p, `${p.join('.')} has the wrong JSON type`);
      }
    }
    if (s.oneOf) {
      const ok = s.oneOf.filter((b) => this.v(b, val, p, code) === null).length;
      if (ok !== 1) return this.fault(code, p, `${p.join('.') || 'the document'} matches ${ok} of oneOf`);
    }
    if (s.not && this.v(s.not, val, p, code) === null) return this.fault(code, p, 'matches what is not allowed');

    if (s.type !== undefined) {
      const types = Array.isArray(s.type) ? s.type : [s.type];
      if (!types.some((t) => this.typeMatches(t, val, p))) {
        return this.fault(code, p, `${p.join('.') || 'the document'} has the wrong JSON type`);
      }
    }
    if ('const' in s && !deepEqual(s.const, val)) return this.fault(code, p, `${p.join('.')} is not ${JSON.stringify(s.const)}`);
    if (s.enum && !s.enum.some((e) => deepEqual(e, val))) return this.fault(code, p, `${p.join('.')} is not one of ${JSON.stringify(s.enum)}`);

    const t = jsonType(val);
    if (t === 'string') {
      const pathCode = isPathSchema(s) ? 'SandboxPathRejected' : code;
      if (s.maxLength !== undefined && [...val].length > s.maxLength) return this.fault(pathCode, p, `${p.join('.')} is longer than ${s.maxLength} characters`);
      if (s.pattern !== undefined && !regex(s.pattern).test(val)) return this.fault(pathCode, p, `${p.join('.')} does not match ${s.pattern}`);
    }
    if (t === 'number') {
      if (s.minimum !== undefined && val < s.minimum) return this.fault(code, p, `${p.join('.')} is below ${s.minimum}`);
      if (s.maximum !== undefined && val > s.maximum) return this.fault(code, p, `${p.join('.')} is above ${s.maximum}`);
    }
    if (t === 'array') {
      if (s.minItems !== undefined && val.length < s.minItems) return this.fault(code, p, `${p.join('.')} has fewer than ${s.minItems} items`);
      if (s.maxItems !== undefined && val.length > s.maxItems) return this.fault(code, p, `${p.join('.')} has more than ${s.maxItems} items`);
      if (s.uniqueItems) {
        for (let a = 0; a < val.length; a++) {
          for (let b = 0; b < a; b++) {
            if (deepEqual(val[a], val[b])) return this.fault(code, p, `${p.join('.')} holds an item twice`);
          }
        }
      }
      if (s.items) {
        for (let k = 0; k < val.length; k++) {
          const f = this.v(s.items, val[k], [...p, k], code);
          if (f) return f;
        }
      }
      if (s.contains && !val.some((x, k) => this.v(s.contains, x, [...p, k], code) === null)) {
        return this.fault(code, p, `${p.join('.')} lacks a required item`);
      }
    }
    if (t === 'object') {
      for (const k of s.required || []) {
        if (!Object.prototype.hasOwnProperty.call(val, k)) return this.fault(code, [...p, k], `required field ${[...p, k].join('.')} is missing`);
      }
      const props = s.properties || {};
      const patterns = Object.keys(s.patternProperties || {});
      for (const k of Object.keys(val)) {
        const kp = [...p, k];
        if (s.propertyNames) {
          const f = this.v(s.propertyNames, k, kp, code);
          if (f) return this.fault(code, kp, `${kp.join('.')} is not an allowed name`);
        }
        let known = false;
        if (Object.prototype.hasOwnProperty.call(props, k)) {
          known = true;
          const f = this.v(props[k], val[k], kp, code);
          if (f) return f;
        }
        for (const pat of patterns) {
          if (regex(pat).test(k)) {
            known = true;
            const f = this.v(s.patternProperties[pat], val[k], kp, code);
            if (f) return f;
          }
        }
        if (!known && s.additionalProperties !== undefined) {
          if (s.additionalProperties === false) return this.fault(code, kp, `unknown field ${kp.join('.')}`);
          const f = this.v(s.additionalProperties, val[k], kp, code);
          if (f) return f;
        }
      }
    }

    if (s.allOf) {
      for (const sub of s.allOf) {
        const f = this.v(sub, val, p, code);
        if (f) return f;
      }
    }
    if (s.if !== undefined) {
      const branch = this.v(s.if, val, p, code) === null ? s.then : s.else;
      if (branch !== undefined) {
        const f = this.v(branch, val, p, code);
        if (f) return f;
      }
    }
    return null;
  }
}

// Fill every default the schema states into the decoded value (README step 4). Defaults
// inside if/then/else (only the envelope's release_destroys) are the envelope's business,
// not a request's, and are not filled here.
function fillDefaults(root, s, val) {
  if (!s || typeof s !== 'object') return val;
  if (s.$ref) {
    const name = /^#\/\$defs\/(.+)$/.exec(s.$ref)[1];
    val = fillDefaults(root, root.$defs[name], val);
  }
  if (s.anyOf) {
    for (const b of s.anyOf) if (b.type && jsonType(val) === b.type) val = fillDefaults(root, b, val);
  }
  if (jsonType(val) === 'object' && s.properties) {
    for (const [k, sub] of Object.entries(s.properties)) {
      if (!Object.prototype.hasOwnProperty.call(val, k) && 'default' in sub) val[k] = structuredClone(sub.default);
      if (Object.prototype.hasOwnProperty.call(val, k)) val[k] = fillDefaults(root, sub, val[k]);
    }
  }
  if (jsonType(val) === 'array' && s.items) {
    for (let k = 0; k < val.length; k++) val[k] = fillDefaults(root, s.items, val[k]);
  }
  return val;
}

// ---------------------------------------------------------------------------------------
// Step 3: the rules beyond the schema (the ones a request can break; rule 1,
// minimum-not-above-maximum, is the envelope's and is checked by checkEnvelope below).

const utf8Bytes = (s) => Buffer.byteLength(s, 'utf8');

function pathRejected(field, why) {
  return new WireError('SandboxPathRejected', `${field}: ${why}`, field);
}

/** path-staged-once, for one MountPlan at `prefix` ('' alone, 'mounts.K.' in a request). */
function checkStagedOnce(plan, prefix) {
  const files = new Set();
  const dirs = new Set();
  plan.files.forEach((file, idx) => {
    if (files.has(file.path) || dirs.has(file.path)) {
      throw pathRejected(`${prefix}files.${idx}.path`, 'a path staged twice, or a file where a directory is needed');
    }
    files.add(file.path);
    for (let k = file.path.indexOf('/'); k !== -1; k = file.path.indexOf('/', k + 1)) dirs.add(file.path.slice(0, k));
  });
  for (const f of files) if (dirs.has(f)) throw pathRejected(`${prefix}files`, `${f} is both a file and a directory above another file`);
}

/** mount-targets-apart, for the mounts of a provision, clone or resume request. */
function checkTargetsApart(mounts) {
  for (let j = 0; j < mounts.length; j++) {
    for (let k = 0; k < j; k++) {
      const a = mounts[j].target;
      const b = mounts[k].target;
      if (a === b || a.startsWith(b + '/') || b.startsWith(a + '/')) {
        throw pathRejected(`mounts.${j}.target`, `overlaps mounts.${k}.target`);
      }
    }
  }
}

/** path-utf8-bytes, for every sandbox path the message holds. */
function checkPathBytes(name, msg) {
  const check = (value, field) => {
    if (typeof value === 'string' && utf8Bytes(value) > 4096) throw pathRejected(field, 'more than 4096 bytes of UTF-8');
  };
  if (typeof msg.path === 'string') check(msg.path, 'path');
  if (typeof msg.cwd === 'string') check(msg.cwd, 'cwd');
  if (Array.isArray(msg.paths)) msg.paths.forEach((q, k) => check(q, `paths.${k}`));
  const plans = name === 'MountPlan' ? [[msg, '']] : (msg.mounts || []).map((m, k) => [m, `mounts.${k}.`]);
  for (const [plan, prefix] of plans) {
    check(plan.target, `${prefix}target`);
    plan.files.forEach((f, k) => check(f.path, `${prefix}files.${k}.path`));
  }
}

/** timestamp-real-date: the schema's pattern let the timestamp through; its date must exist (no 30 February). */
function checkRealDate(stamp, field) {
  const [y, m, d] = stamp.slice(0, 10).split('-').map(Number);
  const date = new Date(Date.UTC(y, m - 1, d));
  if (y < 1 || date.getUTCFullYear() !== y || date.getUTCMonth() !== m - 1 || date.getUTCDate() !== d) {
    throw new WireError('SandboxResultInvalid', `${field}: ${stamp.slice(0, 10)} is not a real date`, field);
  }
}

// ---------------------------------------------------------------------------------------
// The profile digest: "sha256:" + hex SHA-256 of the RFC 8785 (JCS) canonical JSON of the
// decoded profile. Our values hold only strings, safe integers, booleans, null, arrays and
// objects, for which JCS is: keys sorted by UTF-16 code units (JavaScript's default sort),
// no whitespace, JSON.stringify's string escapes, integers as plain digits.

function canonical(v) {
  switch (jsonType(v)) {
    case 'array':
      return '[' + v.map(canonical).join(',') + ']';
    case 'object':
      return '{' + Object.keys(v).sort().map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
    default:
      return JSON.stringify(v);
  }
}

const sha256hex = (data) => crypto.createHash('sha256').update(data).digest('hex');
const profileDigest = (profile) => 'sha256:' + sha256hex(Buffer.from(canonical(profile), 'utf8'));

// ---------------------------------------------------------------------------------------
// The decoder: decode(name, bytes) runs the steps in order and returns the decoded value,
// or throws the WireError a conforming decoder reports.

class Decoder {
  constructor(schemaDir) {
    this.schemas = loadSchemas(schemaDir);
  }

  /** Steps 2-4 on an already parsed value. */
  decodeValue(name, value, nonIntegers = new Set(), ownCodes = OWN_CODES) {
    const schema = this.schemas[name];
    if (!schema) throw new Error(`no schema for ${name}`);
    const fault = new Validator(schema, nonIntegers, ownCodes).v(schema, value, [], messageCode(name));
    if (fault) throw new WireError(fault.code, fault.message, fault.field);
    this.rules(name, value);
    return fillDefaults(schema, schema, value);
  }

  decode(name, bytes) {
    const { value, nonIntegers } = parseIJson(bytes, messageCode(name));
    return this.decodeValue(name, value, nonIntegers);
  }

  /**
   * An openProcess text frame (not served by this provider; here so that check-vectors.js
   * can hold the decoder to every vector). `frameTypes` maps each type the sender may send
   * to its schema name (index.json's frame_types). The frame vectors, not the README, say
   * the fields: a JSON text fault is field "frame", a frame that is not an object or has no
   * known type is field "type", and a bad field is named inside its frame's schema.
   */
  decodeFrame(frameTypes, bytes) {
    let parsed;
    try {
      parsed = parseIJson(bytes, 'SandboxProtocolViolation');
    } catch (e) {
      if (e instanceof WireError) e.field = 'frame';
      throw e;
    }
    const { value, nonIntegers } = parsed;
    const type = jsonType(value) === 'object' ? value.type : undefined;
    if (typeof type !== 'string' || !Object.prototype.hasOwnProperty.call(frameTypes, type)) {
      throw new WireError('SandboxProtocolViolation', 'not a frame of a type this sender may send', 'type');
    }
    // inside a frame every fault is the frame's SandboxProtocolViolation, even one inside
    // the ProcessStarted a server start frame carries (the README's table says otherwise;
    // the vector ServerFrame/invalid-started-without-process-id says this)
    return this.decodeValue(frameTypes[type], value, nonIntegers, {});
  }

  rules(name, msg) {
    if (name === 'SandboxProviderCapabilities') return checkEnvelope(msg);
    if (name === 'DescribeResult') return checkEnvelope(msg.envelope, 'envelope.');
    if (jsonType(msg) !== 'object') return;
    checkPathBytes(name, msg);
    if (name === 'SnapshotResult' && typeof msg.expires_at === 'string') checkRealDate(msg.expires_at, 'expires_at');
    if (name === 'MountPlan') checkStagedOnce(msg, '');
    if (Array.isArray(msg.mounts)) {
      msg.mounts.forEach((m, k) => checkStagedOnce(m, `mounts.${k}.`));
      checkTargetsApart(msg.mounts);
    }
    if (msg.profile && typeof msg.profile_digest === 'string') {
      // checked after the profile itself decodes, on the profile with its defaults filled in
      const decoded = fillDefaults(this.schemas.SandboxProfile, this.schemas.SandboxProfile, structuredClone(msg.profile));
      if (profileDigest(decoded) !== msg.profile_digest) {
        throw new WireError('SandboxDigestMismatch', 'profile_digest is not the digest of the profile beside it', 'profile_digest');
      }
    }
  }
}

/** minimum-not-above-maximum, the envelope's one rule beyond its schema. */
function checkEnvelope(env, prefix = '') {
  for (const d of ['cpu_millis', 'memory_mib', 'disk_mib', 'pids']) {
    if (env.minimum_resources[d] > env.maximum_resources[d]) {
      throw new WireError('SandboxEnvelopeInvalid', `minimum_resources.${d} is above maximum_resources.${d}`, `${prefix}minimum_resources.${d}`);
    }
  }
}

module.exports = { Decoder, WireError, parseIJson, canonical, profileDigest, sha256hex, messageCode, MAX_MESSAGE_BYTES };

// For check-vectors.js only: the validator, to evaluate one envelope clause alone.
module.exports._internals = { Validator };
