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
// schema's defaults filled in (Ajv's useDefaults), computed here from scratch.
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

const count = (table, key) => (table[key] = (table[key] ?? 0) + 1);
const fail = (path, why, extra) => failures.push({ vector: path, why, ...(extra ? { detail: extra } : {}) });

for (const [name, entry] of Object.entries(index.messages)) {
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

const example = read(index.digest_example);
try {
  const worked = profileDigest(example.profile_as_written);
  report.digests += 1;
  if (worked.canonical !== example.canonical) fail(index.digest_example, "canonical bytes differ", worked.canonical);
  if (worked.digest !== example.digest) fail(index.digest_example, `digest ${example.digest}, computed ${worked.digest}`);
} catch (err) {
  fail(index.digest_example, `cannot compute the digest: ${err.message}`);
}

report.failures = failures;
report.warnings = warnings;
process.stdout.write(JSON.stringify(report, null, 2) + "\n");
process.exit(failures.length ? 1 : 0);
