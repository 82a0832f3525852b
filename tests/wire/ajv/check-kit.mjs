// Checks an exported author kit with Ajv (JSON Schema draft 2020-12), a validator of another
// language than the one that wrote the schemas, reading nothing but the kit's own files.
//
//   node check-kit.mjs KIT_DIR
//
// Every valid vector must pass its schema. Every invalid vector must be refused by the layer it
// names: "schema" vectors must fail the schema; "rule" vectors must pass it (a rule beyond JSON
// Schema, named in beyond_schema, refuses them); "json" vectors break a rule of the JSON text
// (not-json and nan do not parse; a duplicate key or an unpaired surrogate parses, and then the
// schema accepts the document: the text rule is its only fault). Every profile_digest of a valid
// vector, and the digest example, must be SHA-256 of the RFC 8785 form of the profile with the
// schema's defaults filled in (Ajv's useDefaults), computed here from scratch; so must the envelope
// digest example's, of the envelope with its defaults filled in.
//
// It also holds the kit to what its README says a decoder reports, from Ajv's own errors: every
// message names its code in index.json; a schema vector refused as SandboxPathRejected fails a
// pattern or maxLength marked with a "$comment" beginning "sandbox path rule:" at exactly the
// vector's field (and no other schema vector does, and no frame vector is SandboxPathRejected);
// a vector whose only fault is one if/then clause names a field that clause's "$comment" lists
// after "; field: ".
//
// Prints one JSON report on stdout; exits 1 when anything failed.

import Ajv2020 from "ajv/dist/2020.js";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const root = process.argv[2];
if (!root) {
  console.error("usage: node check-kit.mjs KIT_DIR");
  process.exit(2);
}
const read = (rel) => JSON.parse(readFileSync(join(root, rel), "utf8"));

const warnings = [];
const logger = { log() {}, warn: (...a) => warnings.push(a.join(" ")), error: (...a) => warnings.push(a.join(" ")) };
const options = { strict: true, allErrors: true, logger };
const ajv = new Ajv2020(options);
const withDefaults = new Ajv2020({ ...options, useDefaults: true });
const verbose = new Ajv2020({ ...options, verbose: true });
const PATH_RULE = "sandbox path rule:";
const CLAUSE_FIELD = "; field: ";

const index = read("index.json");
const failures = [];
const report = {
  ajv: JSON.parse(readFileSync(new URL("./node_modules/ajv/package.json", import.meta.url), "utf8")).version,
  schemas: 0,
  vectors: 0,
  valid: 0,
  refused_by: {},
  beyond_schema: {},
  json_rules: {},
  digests: 0,
  path_rule: 0,
  clause_fields: 0,
  openapi: null,
};

// RFC 8785 (JCS) for the values a message holds: strings, integers, booleans, null, arrays, objects.
// Keys sort by UTF-16 code units (JavaScript's default sort); JSON.stringify writes strings and
// integers exactly as RFC 8785 does.
function canonical(value) {
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  if (value !== null && typeof value === "object") {
    return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + canonical(value[k])).join(",") + "}";
  }
  if (typeof value === "number" && !Number.isSafeInteger(value)) throw new Error(`not a safe integer: ${value}`);
  return JSON.stringify(value);
}

const sha256 = (text) => "sha256:" + createHash("sha256").update(Buffer.from(text, "utf8")).digest("hex");

const validators = new Map();
function validatorFor(path) {
  if (!validators.has(path)) {
    validators.set(path, ajv.compile(read(path)));
    report.schemas += 1;
  }
  return validators.get(path);
}

let fillProfile = null;
function profileDigest(profile) {
  if (fillProfile === null) fillProfile = withDefaults.compile(read("schemas/SandboxProfile.schema.json"));
  const filled = structuredClone(profile);
  if (!fillProfile(filled)) throw new Error("the profile does not validate: " + JSON.stringify(fillProfile.errors));
  return { filled, canonical: canonical(filled), digest: sha256(canonical(filled)) };
}

// The envelope digest, by the README's rule: every default filled in (rule 7's conditional release_destroys
// included: the schema states it as the default of an if/then clause, which Ajv fills), RFC 8785, SHA-256.
let fillEnvelope = null;
function envelopeDigest(envelope) {
  if (fillEnvelope === null) {
    fillEnvelope = withDefaults.compile(read("schemas/SandboxProviderCapabilities.schema.json"));
  }
  const filled = structuredClone(envelope);
  if (!fillEnvelope(filled)) throw new Error("the envelope does not validate: " + JSON.stringify(fillEnvelope.errors));
  return { filled, canonical: canonical(filled), digest: sha256(canonical(filled)) };
}

const count = (table, key) => (table[key] = (table[key] ?? 0) + 1);

const verboseValidators = new Map();
function verboseErrors(path, doc) {
  if (!verboseValidators.has(path)) verboseValidators.set(path, verbose.compile(read(path)));
  const validate = verboseValidators.get(path);
  return validate(doc) ? [] : validate.errors;
}

// "a.0.b" as Ajv's instancePath "/a/0/b"; null (the whole document) as "".
const pointer = (field) => (field === null ? "" : "/" + field.split(".").join("/"));
const dotted = (instancePath) => instancePath.split("/").slice(1).join(".");

// What Ajv's errors say about a schema vector: a path-rule fault, and a fault of one clause alone.
function judge(path, name, entry, vector) {
  const errors = verboseErrors(entry.schema, vector.document);
  const at = pointer(vector.expect.field);
  const pathFault = errors.some(
    (e) =>
      (e.keyword === "pattern" || e.keyword === "maxLength") &&
      e.instancePath === at &&
      typeof e.parentSchema?.$comment === "string" &&
      e.parentSchema.$comment.startsWith(PATH_RULE),
  );
  const isPath = vector.expect.code === "SandboxPathRejected";
  if ("frame_types" in entry) {
    if (isPath) fail(path, "a frame fault is SandboxProtocolViolation, never SandboxPathRejected");
  } else if (isPath !== pathFault) {
    fail(path, isPath ? "SandboxPathRejected, but no marked path pattern fails there" : "a marked path pattern fails, but the code is not SandboxPathRejected", errors);
  } else if (isPath) {
    report.path_rule += 1;
  }
  const clauses = errors.filter((e) => e.keyword === "if");
  if (clauses.length === 1) {
    const clause = clauses[0];
    const prefix = clause.schemaPath.slice(0, -"/if".length) + "/";
    if (errors.every((e) => e === clause || e.schemaPath.startsWith(prefix))) {
      const comment = clause.parentSchema.$comment ?? "";
      if (!comment.includes(CLAUSE_FIELD)) {
        fail(path, `the clause ${clause.schemaPath} names no field in its $comment`);
        return;
      }
      const base = dotted(clause.instancePath);
      const fields = comment.slice(comment.lastIndexOf(CLAUSE_FIELD) + CLAUSE_FIELD.length).split(",");
      const named = fields.map((f) => (base ? base + "." : "") + f.trim());
      if (!named.includes(vector.expect.field)) fail(path, `the clause's $comment names ${named}, the vector ${vector.expect.field}`);
      else report.clause_fields += 1;
    }
  }
}
const fail = (path, why, extra) => failures.push({ vector: path, why, ...(extra ? { detail: extra } : {}) });

for (const [name, entry] of Object.entries(index.messages)) {
  if (typeof entry.code !== "string" || !entry.code.startsWith("Sandbox")) fail(entry.schema, `${name} names no code in index.json`);
  let validate;
  try {
    validate = validatorFor(entry.schema);
  } catch (err) {
    fail(entry.schema, `Ajv cannot compile it: ${err.message}`);
    continue;
  }
  for (const path of entry.vectors) {
    const vector = read(path);
    report.vectors += 1;
    if (vector.message !== name) fail(path, `is listed under ${name} but says ${vector.message}`);
    if (vector.valid) {
      report.valid += 1;
      if (!validate(vector.document)) fail(path, "a valid vector fails its schema", validate.errors);
      const doc = vector.document;
      if (doc && typeof doc === "object" && "profile" in doc && "profile_digest" in doc) {
        try {
          const mine = profileDigest(doc.profile).digest;
          report.digests += 1;
          if (mine !== doc.profile_digest) fail(path, `profile_digest ${doc.profile_digest}, computed ${mine}`);
        } catch (err) {
          fail(path, `cannot compute the profile digest: ${err.message}`);
        }
      }
      continue;
    }
    const layer = vector.refused_by;
    count(report.refused_by, layer);
    if (layer === "schema") {
      if (!("document" in vector)) fail(path, "a schema vector without a document");
      else if (validate(vector.document)) fail(path, "the schema accepts a vector it should refuse");
      else judge(path, name, entry, vector);
    } else if (layer === "rule") {
      count(report.beyond_schema, vector.beyond_schema);
      let doc = vector.document;
      if (!("document" in vector)) {
        try {
          doc = JSON.parse(vector.document_text);
        } catch (err) {
          fail(path, `a rule vector's text does not parse: ${err.message}`);
          continue;
        }
      }
      if (!validate(doc)) fail(path, `the schema refuses a vector only ${vector.beyond_schema} should`, validate.errors);
    } else if (layer === "json") {
      count(report.json_rules, vector.json_rule);
      let doc;
      try {
        doc = JSON.parse(vector.document_text);
      } catch {
        if (vector.json_rule !== "not-json" && vector.json_rule !== "nan") fail(path, "the text does not parse");
        continue;
      }
      if (vector.json_rule === "not-json" || vector.json_rule === "nan") {
        fail(path, `${vector.json_rule}: the text parses`);
      } else if (!validate(doc)) {
        fail(path, `the document is refused for more than ${vector.json_rule}`, validate.errors);
      }
    } else {
      fail(path, `unknown refused_by ${JSON.stringify(layer)}`);
    }
  }
}

for (const path of Object.values(index.frame_schemas)) {
  try {
    validatorFor(path);
  } catch (err) {
    fail(path, `Ajv cannot compile it: ${err.message}`);
  }
}

try {
  const openapi = read(index.openapi);
  report.openapi = openapi.openapi;
  if (!/^3\.1\./.test(openapi.openapi ?? "")) fail(index.openapi, `not an OpenAPI 3.1 document: ${openapi.openapi}`);
} catch (err) {
  fail(String(index.openapi), `cannot read the OpenAPI document: ${err.message}`);
}

const example = read(index.digest_example);
try {
  const worked = profileDigest(example.profile_as_written);
  report.digests += 1;
  if (worked.canonical !== example.canonical) fail(index.digest_example, "canonical bytes differ", worked.canonical);
  if (worked.digest !== example.digest) fail(index.digest_example, `digest ${example.digest}, computed ${worked.digest}`);
} catch (err) {
  fail(index.digest_example, `cannot compute the digest: ${err.message}`);
}

const envelopeExample = read(index.envelope_digest_example);
try {
  const worked = envelopeDigest(envelopeExample.envelope_as_written);
  report.digests += 1;
  if (worked.canonical !== envelopeExample.canonical) {
    fail(index.envelope_digest_example, "canonical bytes differ", worked.canonical);
  }
  if (worked.digest !== envelopeExample.digest) {
    fail(index.envelope_digest_example, `digest ${envelopeExample.digest}, computed ${worked.digest}`);
  }
} catch (err) {
  fail(index.envelope_digest_example, `cannot compute the digest: ${err.message}`);
}

report.failures = failures;
report.warnings = warnings;
process.stdout.write(JSON.stringify(report, null, 2) + "\n");
process.exit(failures.length ? 1 : 0);
