#!/usr/bin/env node
// An AMQP 1.0 receiver on rhea, driven by tests/clients/harness.py.
//
//   node rhea_receive.js HOST PORT ADDRESS COUNT PREFETCH RATE
//
// ADDRESS is a RabbitMQ 3.10 amqp1_0 plugin source: /amq/queue/NAME (an existing queue; a
// missing one detaches with amqp:not-found) or /queue/NAME (declares NAME non-durable first).
// COUNT is how many messages to accept before exiting (0 = until stopped). PREFETCH is the
// credit window: at most PREFETCH messages granted or waiting; credit is topped up in batches
// of a quarter window as messages are accepted (RabbitMQ 3.10 may still send a few transfers
// past the credit: 'delivered' counts what arrived). RATE is messages a second it accepts,
// 0 = as fast as they come. Bodies that start with a 10-digit sequence number are checked for
// order.
//
// Events (JSON lines): ready, progress {received, delivered, backlog, credit, out_of_order,
// last_seq} every 100 ms, error, done {received, ...}.
'use strict';

const rhea = require('rhea');
const {emit, bodySeq, packageVersion, args, connect, pacer, lifecycle, failOnErrors} =
  require('./common');

const argv = args('rhea_receive.js', ['HOST', 'PORT', 'ADDRESS', 'COUNT', 'PREFETCH', 'RATE']);
const [host, portText, address] = argv;
const count = Number.parseInt(argv[3], 10);
const prefetch = Number.parseInt(argv[4], 10);
const rate = Number.parseFloat(argv[5]);

const state = {received: 0, delivered: 0, out_of_order: 0, last_seq: null};
const backlog = [];
const pace = pacer(rate);
let start = null;
let timer = null;

const {container, connection} = connect(rhea, 'floodwall-test-rhea-receive', host, portText);
const receiver = connection.open_receiver({
  source: {address},
  credit_window: 0, // credit is granted by hand, below
  autoaccept: false,
});

function snapshot() {
  return {...state, backlog: backlog.length, credit: receiver.credit};
}

const life = lifecycle(connection, snapshot, (code) => {
  emit(code === 0 ? 'done' : 'progress',
    {...snapshot(), elapsed_s: start === null ? 0 : (Date.now() - start) / 1000});
});

function messageBody(message) {
  const b = message.body;
  if (Buffer.isBuffer(b)) return b;
  if (b && Buffer.isBuffer(b.content)) return b.content;
  if (typeof b === 'string') return Buffer.from(b);
  return null;
}

function process1(delivery, message) {
  const seq = bodySeq(messageBody(message));
  if (seq !== null) {
    if (state.last_seq !== null && seq <= state.last_seq) state.out_of_order += 1;
    state.last_seq = seq;
  }
  delivery.accept();
  state.received += 1;
  if (count > 0 && state.received >= count) {
    life.finish(0);
    return;
  }
  topUp();
}

// Give credit back in batches (as rhea's own credit window does): RabbitMQ 3.10 answers many
// one-message top-ups with more transfers than the credit allowed.
function topUp() {
  const delta = prefetch - receiver.credit - backlog.length;
  if (delta > 0 && delta >= Math.max(1, Math.floor(prefetch / 4))) receiver.add_credit(delta);
}

function drainBacklog() {
  timer = null;
  while (backlog.length > 0 && !life.finished) {
    const wait = pace();
    if (wait > 0) {
      timer = setTimeout(drainBacklog, wait);
      return;
    }
    const [delivery, message] = backlog.shift();
    process1(delivery, message);
  }
}

container.on('receiver_open', () => {
  emit('ready', {client: 'rhea', version: packageVersion('rhea'), node: process.versions.node,
    address, prefetch});
  receiver.add_credit(prefetch);
});
container.on('message', (ctx) => {
  if (life.finished) return;
  if (start === null) start = Date.now();
  state.delivered += 1;
  backlog.push([ctx.delivery, ctx.message]);
  if (timer === null) drainBacklog();
});
failOnErrors(container, 'receiver', life);
