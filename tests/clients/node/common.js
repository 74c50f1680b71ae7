'use strict';
// Shared by rhea_send.js and rhea_receive.js: JSON-lines output, the message body format, the
// command line, the connection, pacing and how a client ends.

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

// The command line: exactly one argument per name, else the usage line on stderr and exit 2.
function args(script, names) {
  const argv = process.argv.slice(2);
  if (argv.length !== names.length) {
    process.stderr.write(`usage: ${script} ${names.join(' ')}\n`);
    process.exit(2);
  }
  return argv;
}

// A rhea container and its connection to HOST:PORT as guest, no reconnect; both named id.
function connect(rhea, id, host, portText) {
  const container = rhea.create_container({id});
  const connection = container.connect({
    host,
    port: Number.parseInt(portText, 10),
    username: 'guest',
    password: 'guest',
    reconnect: false,
    container_id: id,
  });
  return {container, connection};
}

// RATE a second (0 = no pacing); held up for more than CATCH_UP_MS, it goes on at RATE without
// a catch-up burst. wait() is the milliseconds to wait before the next item, or 0: go now (and
// the slot is taken).
const CATCH_UP_MS = 100;

function pacer(rate) {
  let due = null;
  return function wait() {
    if (!(rate > 0)) return 0;
    if (due === null || Date.now() - due > CATCH_UP_MS) due = Date.now(); // no burst
    const ms = due - Date.now();
    if (ms > 0) return ms;
    due += 1000 / rate;
    return 0;
  };
}

// How a client ends: 'progress' with snapshot() every 100 ms until finish(code), which (once)
// calls report(code) for the last event, closes the connection and exits with code within 2 s;
// fail(kind, err) emits 'error' and finishes with 1.
function lifecycle(connection, snapshot, report) {
  const life = {finished: false};
  const progressTimer = setInterval(() => emit('progress', snapshot()), 100);
  const close = (code) => {
    try {
      connection.close();
    } catch (_err) {
      // already gone
    }
    setTimeout(() => process.exit(code), 2000).unref();
  };
  life.finish = (code) => {
    if (life.finished) return;
    life.finished = true;
    clearInterval(progressTimer);
    report(code);
    process.exitCode = code;
    if (code === 0 && process.env.FLOODWALL_HOLD_OPEN === '1') {
      // Pre-settled transfers have no outcome: a broker may drop those still on their way
      // to the queue when the connection closes. The test says when (SIGTERM).
      process.on('SIGTERM', () => close(code));
      return;
    }
    close(code);
  };
  life.fail = (kind, err) => {
    emit('error', errorFields(kind, err));
    life.finish(1);
  };
  return life;
}

// Fail on an error of the link (role 'sender' or 'receiver'), the connection or rhea, and on
// the link or the connection going away before the client finished.
function failOnErrors(container, role, life) {
  container.on(`${role}_error`, (ctx) => life.fail(role, ctx[role].error));
  container.on(`${role}_close`, () => {
    if (!life.finished) life.fail(role, 'link detached by the peer');
  });
  container.on('connection_error', (ctx) => life.fail('connection', ctx.connection.error));
  container.on('protocol_error', (ctx) => life.fail('protocol', ctx.error || 'protocol error'));
  container.on('disconnected', (ctx) => {
    if (!life.finished) life.fail('disconnected', ctx.error || 'connection lost');
  });
  container.on('error', (err) => {
    // Once the client has its verdict it closes; transfers the peer sent before it saw the
    // close are still on the wire (AMQP 1.0 2.6.5), and rhea reports them as an error.
    if (life.finished && /transfer after detach/.test(String(err && err.message))) return;
    life.fail('rhea', err);
  });
}

module.exports = {
  emit, errorFields, body, bodySeq, packageVersion, now, args, connect, pacer, lifecycle,
  failOnErrors,
};
