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
const {emit, body, packageVersion, args, connect, pacer, lifecycle, failOnErrors} =
  require('./common');

const argv = args('rhea_send.js', ['HOST', 'PORT', 'ADDRESS', 'COUNT', 'RATE', 'BODY_SIZE']);
const [host, portText, address] = argv;
const count = Number.parseInt(argv[3], 10);
const rate = Number.parseFloat(argv[4]);
const bodySize = Number.parseInt(argv[5], 10);

const state = {sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0};
let lastCredit = null;
let starved = true; // no credit yet, or credit used up: the next 'sendable' is news
const pace = pacer(rate);
let start = null;
let pumpTimer = null;

const {container, connection} = connect(rhea, 'floodwall-test-rhea-send', host, portText);
const sender = connection.open_sender({target: {address}});

function settled() {
  return state.accepted + state.rejected + state.released + state.modified;
}

function snapshot() {
  return {...state, credit: sender.credit};
}

const life = lifecycle(connection, snapshot, (code) => {
  if (code === 0) {
    emit('done', {...snapshot(), elapsed_s: (Date.now() - start) / 1000});
  } else {
    emit('progress', snapshot());
  }
});

function pump() {
  pumpTimer = null;
  if (life.finished) return;
  if (start === null) start = Date.now();
  while (state.sent < count && sender.sendable()) {
    const wait = pace();
    if (wait > 0) {
      pumpTimer = setTimeout(pump, wait);
      return;
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
  if (settled() >= count) life.finish(0);
};
container.on('accepted', outcome('accepted'));
container.on('rejected', outcome('rejected'));
container.on('released', outcome('released'));
container.on('modified', outcome('modified'));
failOnErrors(container, 'sender', life);

if (count === 0) life.finish(0);
