#!/usr/bin/env node
// An AMQP 1.0 sender on rhea, driven by tests/clients/harness.py.
//
//   node rhea_send.js HOST PORT ADDRESS COUNT RATE BODY_SIZE
//
// ADDRESS is a RabbitMQ 3.10 amqp1_0 plugin target (checked against 3.10.8):
//   /amq/queue/NAME  default exchange, routing key NAME, nothing declared: use it for a queue
//                    the test declared (if NAME does not exist, messages are accepted and
//                    dropped);
//   /queue/NAME      declares NAME non-durable without arguments first (a bare NAME does the
//                    same): refused with amqp:precondition-failed if NAME exists durable or
//                    with arguments;
//   /exchange/X/KEY, /topic/KEY.
// RATE is messages a second, 0 = as fast as credit allows (held up for more than 100 ms, it
// goes on at RATE without a catch-up burst). Bodies are one binary data section: the
// sequence number in 10 ASCII digits, padded with 'x' to BODY_SIZE bytes.
//
// Events (JSON lines): ready (link attached), credit {credit} whenever a flow frame from the
// peer leaves a different credit than last reported, and when sending used the credit up
// (exhausted: true); sendable when sending may go on after credit ran out (and the first
// time); progress every 100 ms; error; done once every message is settled.
'use strict';

const rhea = require('rhea');
const {emit, errorFields, body, packageVersion} = require('./common');

const argv = process.argv.slice(2);
if (argv.length !== 6) {
  process.stderr.write('usage: rhea_send.js HOST PORT ADDRESS COUNT RATE BODY_SIZE\n');
  process.exit(2);
}
const [host, portText, address] = argv;
const count = Number.parseInt(argv[3], 10);
const rate = Number.parseFloat(argv[4]);
const bodySize = Number.parseInt(argv[5], 10);

const state = {sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0};
let lastCredit = null;
let starved = true; // no credit yet, or credit used up: the next 'sendable' is news
const CATCH_UP_MS = 100;
let start = null;
let due = null;
let pumpTimer = null;
let finished = false;

const container = rhea.create_container({id: 'floodwall-test-rhea-send'});
const connection = container.connect({
  host,
  port: Number.parseInt(portText, 10),
  username: 'guest',
  password: 'guest',
  reconnect: false,
  container_id: 'floodwall-test-rhea-send',
});
const sender = connection.open_sender({target: {address}});

function settled() {
  return state.accepted + state.rejected + state.released + state.modified;
}

function snapshot() {
  return {...state, credit: sender.credit};
}

function fail(kind, err) {
  emit('error', errorFields(kind, err));
  finish(1);
}

function finish(code) {
  if (finished) return;
  finished = true;
  clearInterval(progressTimer);
  if (code === 0) {
    emit('done', {...snapshot(), elapsed_s: (Date.now() - start) / 1000});
  } else {
    emit('progress', snapshot());
  }
  process.exitCode = code;
  try {
    connection.close();
  } catch (_err) {
    // already gone
  }
  setTimeout(() => process.exit(code), 2000).unref();
}

function pump() {
  pumpTimer = null;
  if (finished) return;
  if (start === null) start = Date.now();
  while (state.sent < count && sender.sendable()) {
    if (rate > 0) {
      if (due === null || Date.now() - due > CATCH_UP_MS) due = Date.now(); // no burst
      const wait = due - Date.now();
      if (wait > 0) {
        pumpTimer = setTimeout(pump, wait);
        return;
      }
      due += 1000 / rate;
    }
    sender.send({body: rhea.message.data_section(body(state.sent, bodySize))});
    state.sent += 1;
  }
  if (state.sent < count && sender.credit <= 0 && !starved) {
    starved = true;
    lastCredit = 0;
    emit('credit', {credit: 0, exhausted: true, sent: state.sent});
  }
}

container.on('connection_open', () => emit('connected', {}));
container.on('sender_open', () => {
  emit('ready', {client: 'rhea', version: packageVersion('rhea'), node: process.versions.node,
    address, credit: sender.credit});
});
container.on('sender_flow', (ctx) => {
  const credit = ctx.sender.credit;
  if (credit !== lastCredit) {
    lastCredit = credit;
    emit('credit', {credit, sent: state.sent});
  }
});
container.on('sendable', () => {
  if (starved) {
    starved = false;
    emit('sendable', {credit: sender.credit, sent: state.sent});
  }
  if (pumpTimer === null) pump();
});
const outcome = (name) => () => {
  state[name] += 1;
  if (settled() >= count) finish(0);
};
container.on('accepted', outcome('accepted'));
container.on('rejected', outcome('rejected'));
container.on('released', outcome('released'));
container.on('modified', outcome('modified'));
container.on('sender_error', (ctx) => fail('sender', ctx.sender.error));
container.on('sender_close', () => {
  if (!finished) fail('sender', 'link detached by the peer');
});
container.on('connection_error', (ctx) => fail('connection', ctx.connection.error));
container.on('protocol_error', (ctx) => fail('protocol', ctx.error || 'protocol error'));
container.on('disconnected', (ctx) => {
  if (!finished) fail('disconnected', ctx.error || 'connection lost');
});
container.on('error', (err) => fail('rhea', err));

const progressTimer = setInterval(() => emit('progress', snapshot()), 100);
if (count === 0) finish(0);
