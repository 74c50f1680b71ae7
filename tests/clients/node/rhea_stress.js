#!/usr/bin/env node
// Several rhea sender links, on several sessions of one connection, each as fast as its credit
// allows; driven by tests/integration/test_amqp10_stress.py.
//
//   node rhea_stress.js HOST PORT LINKS_JSON
//
// LINKS_JSON is a list of {name, session, address, count, size, settled, subjects}: session is
// an index (links with the same index share a session), settled sends pre-settled
// (snd-settle-mode settled), subjects (a list, may be empty) are given to the messages in turn
// (the routing key of a per-message address such as /exchange/amq.direct). Each body is one
// data section: "NAME:SEQ(10 digits):" padded with 'x' to size bytes; bodies larger than the
// peer's max-frame-size go as several transfer frames (rhea splits them).
//
// Events (JSON lines): ready (every link attached), credit {link, credit, starved_at} each time
// a flow gives a link credit after it had none since starved_at (seconds, wall clock), progress every 100 ms, error, done once every
// message is sent and every unsettled one has its outcome.
'use strict';

const rhea = require('rhea');
const {emit, packageVersion, args, connect, lifecycle, failOnErrors} = require('./common');

const argv = args('rhea_stress.js', ['HOST', 'PORT', 'LINKS_JSON']);
const [host, portText, linksJson] = argv;
const specs = JSON.parse(linksJson);

const {container, connection} = connect(rhea, 'floodwall-test-rhea-stress', host, portText);
const sessions = new Map();
const links = specs.map((spec) => {
  let session = sessions.get(spec.session);
  if (session === undefined) {
    session = connection.create_session();
    session.begin();
    sessions.set(spec.session, session);
  }
  const options = {target: {address: spec.address}};
  if (spec.settled) options.snd_settle_mode = 1;
  const sender = session.attach_sender(options);
  return {spec, sender, sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0,
    open: false, starved: true, starvedAt: Date.now() / 1000};
});

function linkOf(sender) {
  return links.find((l) => l.sender === sender);
}

function body(spec, seq) {
  const b = Buffer.alloc(spec.size, 'x');
  b.write(`${spec.name}:${String(seq).padStart(10, '0')}:`, 0, 'ascii');
  return b;
}

function settled(l) {
  return l.accepted + l.rejected + l.released + l.modified;
}

function finished(l) {
  return l.sent >= l.spec.count && (l.spec.settled || settled(l) >= l.spec.count);
}

function snapshot() {
  const out = {};
  for (const l of links) {
    out[l.spec.name] = {sent: l.sent, accepted: l.accepted, rejected: l.rejected,
      released: l.released, modified: l.modified, credit: l.sender.credit};
  }
  return {links: out};
}

const life = lifecycle(connection, snapshot, (code) => {
  emit(code === 0 ? 'done' : 'progress', snapshot());
});

function pump(l) {
  if (life.finished || !l.open) return;
  const spec = l.spec;
  while (l.sent < spec.count && l.sender.sendable() && l.sender.credit > 0) {
    const message = {body: rhea.message.data_section(body(spec, l.sent))};
    if (spec.subjects && spec.subjects.length) {
      message.subject = spec.subjects[l.sent % spec.subjects.length];
    }
    l.sender.send(message);
    l.sent += 1;
  }
  if (l.sent < spec.count && l.sender.credit <= 0 && !l.starved) {
    l.starved = true;
    l.starvedAt = Date.now() / 1000;
  }
  check();
}

function check() {
  if (!life.finished && links.every(finished)) {
    // pre-settled transfers may still be in rhea's buffers: let them out first
    setTimeout(() => life.finish(0), 200);
  }
}

container.on('sender_open', (ctx) => {
  const l = linkOf(ctx.sender);
  l.open = true;
  if (links.every((x) => x.open)) {
    emit('ready', {client: 'rhea', version: packageVersion('rhea'), node: process.versions.node,
      links: links.length, sessions: sessions.size});
  }
  pump(l);
});
container.on('sender_flow', (ctx) => {
  const l = linkOf(ctx.sender);
  if (l.starved && ctx.sender.credit > 0) {
    l.starved = false;
    emit('credit', {link: l.spec.name, credit: ctx.sender.credit, starved_at: l.starvedAt});
  }
});
container.on('sendable', (ctx) => pump(linkOf(ctx.sender)));
for (const outcome of ['accepted', 'rejected', 'released', 'modified']) {
  container.on(outcome, (ctx) => {
    const l = linkOf(ctx.sender);
    l[outcome] += 1;
    check();
  });
}
failOnErrors(container, 'sender', life);
