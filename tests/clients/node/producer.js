#!/usr/bin/env node
// A producer on amqplib (AMQP 0-9-1), driven by tests/clients/harness.py.
//
//   node producer.js HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
//
// Same arguments and JSON lines as java/FloodProducer.java: RATE is messages a second (0 = as
// fast as possible; held up for more than 100 ms, it goes on at RATE without a catch-up
// burst); publishes to the default exchange with routing key QUEUE (not declared here); each
// body starts with its sequence number in 10 ASCII digits, padded with 'x'.
// Events: ready, progress {published} every 100 ms, drain (publish() returned false and the
// socket drained again), blocked/unblocked (Connection.Blocked), error, close, done.
// amqplib has no Channel.Flow support: an unexpected one breaks it (DESIGN.md), which shows
// here as an error event and a non-zero exit.
'use strict';

const amqp = require('amqplib');
const {emit, errorFields, body, packageVersion} = require('./common');

let failed = false;
function fail(kind, err) {
  failed = true;
  emit('error', errorFields(kind, err));
}

process.on('uncaughtException', (err) => {
  fail('uncaught', err);
  process.exit(1);
});
process.on('unhandledRejection', (err) => {
  fail('unhandled_rejection', err);
  process.exit(1);
});

const CATCH_UP_MS = 100;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const tick = () => new Promise((resolve) => setImmediate(resolve));

async function main(argv) {
  if (argv.length < 6 || argv.length > 7) {
    process.stderr.write('usage: producer.js HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]\n');
    process.exit(2);
  }
  const [host, port, queue] = argv;
  const count = Number.parseInt(argv[3], 10);
  const rate = Number.parseFloat(argv[4]);
  const bodySize = Number.parseInt(argv[5], 10);
  const confirm = argv[6] === 'confirm';

  const conn = await amqp.connect({
    protocol: 'amqp',
    hostname: host,
    port: Number.parseInt(port, 10),
    username: 'guest',
    password: 'guest',
    heartbeat: 30,
  }, {clientProperties: {connection_name: 'floodwall-test amqplib producer'}});
  let closing = false;
  conn.on('error', (err) => fail('connection', err));
  conn.on('close', (err) => {
    if (!closing) {
      emit('close', {what: 'connection', ...(err ? errorFields('connection', err) : {})});
      failed = true;
    }
  });
  conn.on('blocked', (reason) => emit('blocked', {reason: String(reason)}));
  conn.on('unblocked', () => emit('unblocked', {}));

  const ch = confirm ? await conn.createConfirmChannel() : await conn.createChannel();
  ch.on('error', (err) => fail('channel', err));
  ch.on('close', () => {
    if (!closing) {
      emit('close', {what: 'channel'});
      failed = true;
    }
  });
  const version = packageVersion('amqplib');
  emit('ready', {client: 'amqplib', version, node: process.versions.node, confirm});

  let published = 0;
  let drains = 0;
  let drainWaitMs = 0;
  const progress = () => emit('progress', {published, drains, drain_wait_ms: drainWaitMs});
  const timer = setInterval(progress, 100);

  const start = Date.now();
  let due = start;
  for (let seq = 0; seq < count && !failed; seq++) {
    if (rate > 0) {
      if (Date.now() - due > CATCH_UP_MS) due = Date.now(); // held up: no burst to catch up
      const wait = due - Date.now();
      if (wait > 0) await sleep(wait);
      due += 1000 / rate;
    } else if (seq % 100 === 0) {
      await tick(); // let timers and socket events run
    }
    const ok = ch.sendToQueue(queue, body(seq, bodySize));
    published = seq + 1;
    if (!ok) {
      const t0 = Date.now();
      await new Promise((resolve) => ch.once('drain', resolve));
      drains += 1;
      drainWaitMs += Date.now() - t0;
      emit('drain', {published, waited_ms: Date.now() - t0});
    }
  }
  if (confirm && !failed) await ch.waitForConfirms();
  clearInterval(timer);
  if (failed) {
    progress();
    process.exit(1);
  }
  emit('done', {
    published,
    drains,
    drain_wait_ms: drainWaitMs,
    confirmed: confirm,
    elapsed_s: (Date.now() - start) / 1000,
  });
  closing = true;
  await ch.close();
  await conn.close();
}

main(process.argv.slice(2)).catch((err) => {
  fail('fatal', err);
  process.exit(1);
});
