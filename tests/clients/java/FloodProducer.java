// A producer on the RabbitMQ Java client (Debian's librabbitmq-client-java, 5.0), driven by
// tests/clients/harness.py. Prints one JSON object a line on stdout.
//
//   java -cp BUILD:amqp-client.jar:slf4j-api.jar:slf4j-nop.jar FloodProducer \
//        HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
//
// RATE is messages a second, 0 = as fast as possible; a producer held up for more than
// 100 ms goes on at RATE from there, without a burst to catch up. Publishes to the default
// exchange with routing key QUEUE (the queue is not declared here). Each body starts with its
// sequence number, 10 ASCII digits, padded with 'x' to BODY_SIZE bytes.
//
// Events: ready, flow {active}, progress {published} every 100 ms, unblocked {seq, waited_ms}
// after a publish that waited on Channel.Flow, error, done {published}.
//
// Client 5.0 has no FlowListener (no Channel.addFlowListener in the 5.0.0 jar). On
// Channel.Flow(active=false) ChannelN.processAsync sets AMQChannel._blockContent and replies
// FlowOk; AMQChannel.quiescingTransmit(AMQCommand) then waits on _channelMutex while
// _blockContent is set for every content-bearing method (basicPublish), so the publishing
// thread really stops inside basicPublish. _blockContent is a public volatile field: a watcher
// thread polls it to report flow events, and the main loop times every basicPublish.

import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.impl.AMQChannel;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Locale;
import java.util.concurrent.locks.LockSupport;

public final class FloodProducer {
    private static final Object OUT = new Object();
    private static final long SLOW_PUBLISH_NANOS = 5_000_000L;
    private static final long CATCH_UP_NANOS = 100_000_000L;

    private static volatile long published;
    private static volatile boolean flowActive = true;
    private static volatile long flowFlips;
    private static volatile long blockedNanos;
    private static volatile long stalledNanos;
    private static volatile long maxPublishNanos;
    private static volatile long publishStartedAt; // 0 when not inside basicPublish
    private static volatile boolean finished;

    private FloodProducer() {
    }

    private static String now() {
        long ms = System.currentTimeMillis();
        return String.format(Locale.ROOT, "%d.%03d", ms / 1000, ms % 1000);
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }

    /** Print {"event":NAME, ...fields, "t":now}; fields is a pre-rendered JSON fragment. */
    private static void emit(String name, String fields) {
        String line = "{\"event\":" + quote(name) + (fields.isEmpty() ? "" : "," + fields)
                + ",\"t\":" + now() + "}";
        synchronized (OUT) {
            System.out.println(line);
            System.out.flush();
        }
    }

    private static String counters() {
        long inside = publishStartedAt;
        boolean waiting = inside != 0 && !flowActive;
        return "\"published\":" + published
                + ",\"blocked_ms\":" + (blockedNanos / 1_000_000L)
                + ",\"stalled_ms\":" + (stalledNanos / 1_000_000L)
                + ",\"max_publish_ms\":" + (maxPublishNanos / 1_000_000L)
                + ",\"flow_active\":" + flowActive
                + ",\"waiting\":" + waiting;
    }

    private static byte[] body(long seq, int size) {
        byte[] b = new byte[size];
        Arrays.fill(b, (byte) 'x');
        byte[] digits = String.format("%010d", seq).getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(digits, 0, b, 0, Math.min(size, digits.length));
        return b;
    }

    private static Thread daemon(String name, Runnable r) {
        Thread t = new Thread(r, name);
        t.setDaemon(true);
        t.start();
        return t;
    }

    public static void main(String[] args) {
        if (args.length < 6 || args.length > 7) {
            System.err.println(
                    "usage: FloodProducer HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]");
            System.exit(2);
        }
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        String queue = args[2];
        long count = Long.parseLong(args[3]);
        double rate = Double.parseDouble(args[4]);
        int bodySize = Integer.parseInt(args[5]);
        boolean confirm = args.length == 7 && args[6].equals("confirm");
        try {
            System.exit(run(host, port, queue, count, rate, bodySize, confirm));
        } catch (Throwable e) {
            emit("error", "\"kind\":" + quote(e.getClass().getName())
                    + ",\"message\":" + quote(String.valueOf(e.getMessage())));
            e.printStackTrace();
            System.exit(1);
        }
    }

    private static int run(String host, int port, String queue, long count, double rate,
                           int bodySize, boolean confirm) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setHost(host);
        factory.setPort(port);
        // Without recovery, createChannel returns the ChannelN itself (an AMQChannel).
        factory.setAutomaticRecoveryEnabled(false);
        Connection conn = factory.newConnection("floodwall-test FloodProducer");
        conn.addShutdownListener(cause -> {
            if (!cause.isInitiatedByApplication()) {
                emit("error", "\"kind\":\"connection_shutdown\",\"message\":"
                        + quote(String.valueOf(cause.getMessage())));
            }
        });
        Channel ch = conn.createChannel();
        if (confirm) {
            ch.confirmSelect();
        }
        final AMQChannel amq = ch instanceof AMQChannel ? (AMQChannel) ch : null;
        Object version = conn.getClientProperties().get("version");
        emit("ready", "\"client\":\"java\",\"version\":" + quote(String.valueOf(version))
                + ",\"flow_observable\":" + (amq != null) + ",\"confirm\":" + confirm);

        if (amq != null) {
            daemon("flow-watcher", () -> {
                while (!finished) {
                    boolean active = !amq._blockContent;
                    if (active != flowActive) {
                        flowFlips++;
                        flowActive = active;
                        emit("flow", "\"active\":" + active + ",\"published\":" + published);
                    }
                    LockSupport.parkNanos(200_000L);
                }
            });
        }
        daemon("progress", () -> {
            while (!finished) {
                LockSupport.parkNanos(100_000_000L);
                if (!finished) {
                    emit("progress", counters());
                }
            }
        });

        long start = System.nanoTime();
        long interval = rate > 0 ? (long) (1e9 / rate) : 0;
        long due = start;
        for (long seq = 0; seq < count; seq++) {
            if (rate > 0) {
                if (System.nanoTime() - due > CATCH_UP_NANOS) {
                    due = System.nanoTime(); // held up (blocked): go on at RATE, no burst
                }
                long wait;
                while ((wait = due - System.nanoTime()) > 0) {
                    LockSupport.parkNanos(wait);
                }
                due += interval;
            }
            byte[] payload = body(seq, bodySize);
            long flipsBefore = flowFlips;
            boolean blockedBefore = amq != null && amq._blockContent;
            long t0 = System.nanoTime();
            publishStartedAt = t0;
            ch.basicPublish("", queue, null, payload);
            long dt = System.nanoTime() - t0;
            publishStartedAt = 0;
            published = seq + 1;
            if (dt > maxPublishNanos) {
                maxPublishNanos = dt;
            }
            if (blockedBefore || (flowFlips != flipsBefore && dt >= 1_000_000L)) {
                blockedNanos += dt;
                emit("unblocked", "\"seq\":" + seq + ",\"waited_ms\":" + (dt / 1_000_000L));
            } else if (dt >= SLOW_PUBLISH_NANOS) {
                stalledNanos += dt;
            }
        }
        if (confirm) {
            ch.waitForConfirmsOrDie(120_000L);
        }
        double elapsed = (System.nanoTime() - start) / 1e9;
        finished = true;
        emit("done", counters() + ",\"confirmed\":" + confirm + ",\"elapsed_s\":"
                + String.format(Locale.ROOT, "%.3f", elapsed));
        conn.close();
        return 0;
    }
}
