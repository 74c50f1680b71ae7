'use strict';
// Shared by rhea_send.js and rhea_receive.js: JSON-lines output and the message body format.

function now() {
  return Date.now() / 1000;
}

function emit(event, fields) {
  process.stdout.write(`${JSON.stringify({event, ...(fields || {}), t: now()})}\n`);
}

function errorFields(kind, err) {
  let message = err;
  if (err && err.message !== undefined) message = err.message;
  else if (err && err.description !== undefined) message = err.description;
  else if (err && typeof err === 'object') message = JSON.stringify(err);
  return {
    kind,
    message: String(message),
    code: err && err.condition !== undefined ? err.condition : (err && err.code) || null,
  };
}

// Each body starts with its sequence number in 10 ASCII digits, padded with 'x' to size bytes.
function body(seq, size) {
  const b = Buffer.alloc(size, 'x');
  b.write(String(seq).padStart(10, '0').slice(0, size), 0, 'ascii');
  return b;
}

function bodySeq(buf) {
  if (!buf || buf.length < 10) return null;
  const text = buf.subarray(0, 10).toString('ascii');
  return /^\d{10}$/.test(text) ? Number.parseInt(text, 10) : null;
}

function packageVersion(name) {
  const fs = require('node:fs');
  const path = require('node:path');
  let dir = path.dirname(require.resolve(name));
  while (!fs.existsSync(path.join(dir, 'package.json'))) dir = path.dirname(dir);
  return JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version;
}

module.exports = {emit, errorFields, body, bodySeq, packageVersion, now};
