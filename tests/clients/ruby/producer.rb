#!/usr/bin/env ruby
# frozen_string_literal: true
# A producer on Bunny (Debian's ruby-bunny, 2.19), driven by tests/clients/harness.py. Prints
# one JSON object a line on stdout.
#
#   ruby producer.rb HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
#
# The same arguments and bodies as java/FloodProducer.java: RATE is messages a second, 0 = as
# fast as possible (held up for more than 100 ms, it goes on at RATE without a burst); publishes
# to the default exchange with routing key QUEUE (not declared here); each body starts with its
# sequence number in 10 ASCII digits, padded with 'x' to BODY_SIZE bytes. With confirm it waits
# for every outstanding confirm (wait_for_confirms) after each 100 publishes and at the end.
# After the last publish it makes one RPC (a passive declare of QUEUE).
#
# Events: ready {client, version, properties}, progress {published} every 100 ms, blocked /
# unblocked (Connection.Blocked), error {kind, message}, done {published, confirmed, nacked,
# rpc_ok, elapsed_s}.
#
# Bunny has no handler for a Channel.Flow from the server: Channel#handle_method raises "Do
# not know how to handle #<AMQ::Protocol::Channel::Flow ...>" in the reader loop's thread,
# which ends (Ruby prints the exception on stderr). Publishing goes on, since basic_publish
# only writes, but nothing is read any more: the next RPC (here the passive declare) times
# out after Bunny's continuation timeout (15 s), an error event and exit 1. Automatic
# recovery is off, so that shows.

require 'bunny'
require 'json'
require 'logger'

BATCH = 100
OUT = Mutex.new

def emit(event, fields = {})
  line = JSON.generate({ event: event }.merge(fields).merge(t: Time.now.to_f))
  OUT.synchronize do
    $stdout.write("#{line}\n")
    $stdout.flush
  end
end

def body(seq, size)
  format('%010d', seq)[0, size].ljust(size, 'x')
end

def now
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

if ARGV.length < 6 || ARGV.length > 7
  warn 'usage: producer.rb HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]'
  exit 2
end
host, port, queue = ARGV[0], Integer(ARGV[1]), ARGV[2]
count = Integer(ARGV[3])
rate = Float(ARGV[4])
size = Integer(ARGV[5])
confirm = ARGV[6] == 'confirm'
published = 0

begin
  conn = Bunny.new(host: host, port: port, user: 'guest', password: 'guest',
                   automatically_recover: false, heartbeat: 30,
                   connection_name: 'floodwall-test bunny producer',
                   logger: Logger.new($stderr, level: Logger::WARN))
  conn.start
  conn.on_blocked { |m| emit('blocked', reason: m.reason.to_s) }
  conn.on_unblocked { emit('unblocked') }
  ch = conn.create_channel
  ch.confirm_select if confirm
  emit('ready', client: 'bunny', version: Bunny::VERSION, ruby: RUBY_VERSION,
                properties: conn.instance_variable_get(:@client_properties).select { |_k, v| v.is_a?(String) },
                confirm: confirm)
  progress = Thread.new do
    loop do
      sleep 0.1 # the progress report's period
      emit('progress', published: published)
    end
  end
  exchange = ch.default_exchange
  nacked = 0
  wait_confirms = lambda do
    nacked += ch.nacked_set.size unless ch.wait_for_confirms
  end
  start = now
  due = start
  count.times do |seq|
    if rate.positive?
      due = now if now - due > 0.1 # held up: go on at RATE, no burst
      wait = due - now
      sleep wait if wait.positive? # pacing at RATE
      due += 1.0 / rate
    end
    exchange.publish(body(seq, size), routing_key: queue)
    published = seq + 1
    wait_confirms.call if confirm && (published % BATCH).zero?
  end
  wait_confirms.call if confirm
  ch.queue_declare(queue, passive: true)
  progress.kill
  emit('done', published: published, confirmed: confirm, nacked: nacked, rpc_ok: true,
               elapsed_s: now - start)
  conn.close
rescue Exception => e # rubocop:disable Lint/RescueException -- report whatever ended it
  emit('error', kind: e.class.name, message: e.message.to_s, published: published)
  exit 1
end
