<?php
// A producer on php-amqplib (Debian's php-amqplib, 3.5.3), driven by tests/clients/harness.py.
// Prints one JSON object a line on stdout.
//
//   php producer.php HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
//
// The same arguments and bodies as java/FloodProducer.java: RATE is messages a second, 0 = as
// fast as possible (held up for more than 100 ms, it goes on at RATE without a burst);
// publishes to the default exchange with routing key QUEUE (not declared here); each body
// starts with its sequence number in 10 ASCII digits, padded with 'x' to BODY_SIZE bytes. With
// confirm it waits for every outstanding confirm (wait_for_pending_acks_returns) after each
// 100 publishes and at the end. After the last publish it makes one RPC (a passive declare).
//
// Events: ready {client, version, properties}, flow {active, published}, progress {published}
// at most every 100 ms (from the publishing loop: php-amqplib is single-threaded), error,
// done {published, confirmed, nacked, flows, deferred, rpc_ok, elapsed_s}.
//
// php-amqplib reads from its socket only while it waits (for a confirm, an RPC's reply): without
// confirms a Channel.Flow waits unread until the final RPC. Such a wait dispatches only the
// methods it waits for and puts the rest aside (AbstractChannel::wait, $method_queue), so a
// Channel.Flow is never handled while the program only publishes: no reply, no change. Only
// an unfiltered wait() (a consumer's loop) dispatches it, to AMQPChannel::channel_flow, which
// sets the channel's protected $active and answers with a Channel.Flow of its own (x_flow_ok
// writes method 20/20, not FlowOk 20/21); nothing in basic_publish looks at $active. After the
// final RPC this program dispatches what was put aside (done's ``deferred``: how many), and
// its channel class reports each Channel.Flow (a flow event) after the library's handler ran.

require_once '/usr/share/php/PhpAmqpLib/autoload.php';

use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Package;

const BATCH = 100;

/** The library's channel; a Channel.Flow from the server is handled as ever, then reported. */
final class ReportingChannel extends AMQPChannel
{
    public int $flows = 0;
    /** @var callable */
    public $published;

    protected function channel_flow(PhpAmqpLib\Wire\AMQPReader $reader): void
    {
        parent::channel_flow($reader);
        $this->flows++;
        emit('flow', ['active' => (bool) $this->active, 'published' => ($this->published)()]);
    }

    /** How many methods the library put aside while it waited for acks or an RPC's reply
     * (those waits dispatch only what they wait for); then they are dispatched, as the
     * unfiltered wait() of a consumer's loop does. */
    public function dispatchDeferred(): int
    {
        $deferred = count($this->method_queue);
        while (!empty($this->method_queue)) {
            $this->wait(null, true);
        }
        return $deferred;
    }
}

/** The library's stream connection, with ReportingChannel for its channels. */
final class ReportingConnection extends AMQPStreamConnection
{
    public function channel($channel_id = null)
    {
        if (isset($this->channels[$channel_id])) {
            return $this->channels[$channel_id];
        }
        $channel_id = $channel_id ?: $this->get_free_channel_id();
        $ch = new ReportingChannel($this, $channel_id);
        $this->channels[$channel_id] = $ch;
        return $ch;
    }
}

function emit(string $event, array $fields = []): void
{
    $line = json_encode(['event' => $event] + $fields + ['t' => microtime(true)],
                        JSON_UNESCAPED_SLASHES);
    fwrite(STDOUT, $line . "\n");
    fflush(STDOUT);
}

function body(int $seq, int $size): string
{
    return str_pad(substr(sprintf('%010d', $seq), 0, $size), $size, 'x');
}

if ($argc < 7 || $argc > 8) {
    fwrite(STDERR, "usage: producer.php HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]\n");
    exit(2);
}
[$host, $port, $queue] = [$argv[1], (int) $argv[2], $argv[3]];
$count = (int) $argv[4];
$rate = (float) $argv[5];
$size = (int) $argv[6];
$confirm = ($argv[7] ?? '') === 'confirm';
$published = 0;

try {
    $conn = new ReportingConnection($host, $port, 'guest', 'guest', '/', false, 'AMQPLAIN',
                                    null, 'en_US', 10.0, 130.0, null, false, 30);
    $ch = $conn->channel();
    $ch->published = function () use (&$published): int {
        return $published;
    };
    $nacked = 0;
    if ($confirm) {
        $ch->set_nack_handler(function () use (&$nacked): void {
            $nacked++;
        });
        $ch->confirm_select();
    }
    $properties = [];
    foreach (AMQPStreamConnection::$LIBRARY_PROPERTIES as $key => [$type, $value]) {
        if ($type === 'S' && $value !== '') {
            $properties[$key] = $value;
        }
    }
    emit('ready', ['client' => 'php-amqplib', 'version' => Package::VERSION,
                   'php' => PHP_VERSION, 'properties' => $properties, 'confirm' => $confirm]);
    $start = $lastReport = microtime(true);
    $due = $start;
    for ($seq = 0; $seq < $count; $seq++) {
        if ($rate > 0) {
            if (microtime(true) - $due > 0.1) {
                $due = microtime(true); // held up: go on at RATE, no burst
            }
            $wait = $due - microtime(true);
            if ($wait > 0) {
                usleep((int) ($wait * 1e6)); // pacing at RATE
            }
            $due += 1.0 / $rate;
        }
        $ch->basic_publish(new AMQPMessage(body($seq, $size)), '', $queue);
        $published = $seq + 1;
        if ($confirm && $published % BATCH === 0) {
            $ch->wait_for_pending_acks_returns(120);
        }
        if (microtime(true) - $lastReport >= 0.1) {
            $lastReport = microtime(true);
            emit('progress', ['published' => $published]);
        }
    }
    if ($confirm) {
        $ch->wait_for_pending_acks_returns(120);
    }
    $ch->queue_declare($queue, true);
    $deferred = $ch->dispatchDeferred();
    emit('done', ['published' => $published, 'confirmed' => $confirm, 'nacked' => $nacked,
                  'flows' => $ch->flows, 'deferred' => $deferred, 'rpc_ok' => true,
                  'elapsed_s' => microtime(true) - $start]);
    $ch->close();
    $conn->close();
} catch (Throwable $e) {
    emit('error', ['kind' => get_class($e), 'message' => $e->getMessage(),
                   'published' => $published]);
    exit(1);
}
