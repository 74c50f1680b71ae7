/* A producer on rabbitmq-c (Debian's librabbitmq-dev, 0.11), driven by
 * tests/clients/harness.py. Prints one JSON object a line on stdout.
 *
 *   gcc -O2 -o producer producer.c -lrabbitmq
 *   producer HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
 *
 * The same arguments and bodies as java/FloodProducer.java: RATE is messages a second, 0 = as
 * fast as possible (held up for more than 100 ms, it goes on at RATE without a burst);
 * publishes to the default exchange with routing key QUEUE (not declared here); each body
 * starts with its sequence number in 10 ASCII digits, padded with 'x' to BODY_SIZE bytes.
 * With confirm it reads frames (amqp_simple_wait_frame) until every outstanding confirm is in,
 * after each 100 publishes and at the end. After the last publish it makes one RPC (a passive
 * declare of QUEUE).
 *
 * Events: ready {client, version}, flow {active, published}, progress {published} at most
 * every 100 ms (from the publishing loop), error, done {published, confirmed, nacked, flows,
 * rpc_ok, elapsed_s}.
 *
 * rabbitmq-c has no handler for an incoming Channel.Flow: the frame is handed to whoever
 * reads frames next (amqp_simple_wait_frame; an RPC queues it for later), and no FlowOk is
 * sent unless the application sends one. This program does what the library does: it reports
 * the frame and goes on publishing, without a reply.
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 100

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Print {"event":NAME,FIELDS,"t":now}; FIELDS is a printf format for JSON members. */
static void emit(const char *name, const char *fields, ...) {
  va_list ap;
  printf("{\"event\":\"%s\"", name);
  if (fields[0] != '\0') {
    putchar(',');
    va_start(ap, fields);
    vprintf(fields, ap);
    va_end(ap);
  }
  printf(",\"t\":%.3f}\n", wall());
  fflush(stdout);
}

static long published;

static void fail(const char *kind, const char *message) {
  /* messages here are library texts and method names: no quotes or backslashes */
  emit("error", "\"kind\":\"%s\",\"message\":\"%s\",\"published\":%ld", kind, message,
       published);
  exit(1);
}

static void check_reply(amqp_rpc_reply_t reply, const char *what) {
  char text[256];
  switch (reply.reply_type) {
  case AMQP_RESPONSE_NORMAL:
    return;
  case AMQP_RESPONSE_LIBRARY_EXCEPTION:
    fail(what, amqp_error_string2(reply.library_error));
    break;
  case AMQP_RESPONSE_SERVER_EXCEPTION:
    if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD ||
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
      /* close methods share the layout: reply_code first, then reply_text */
      amqp_channel_close_t *m = (amqp_channel_close_t *)reply.reply.decoded;
      snprintf(text, sizeof text, "server closed: %u %.*s", m->reply_code,
               (int)m->reply_text.len, (char *)m->reply_text.bytes);
      for (char *c = text; *c; c++)
        if (*c == '"' || *c == '\\') *c = '\'';
      fail(what, text);
    }
    fail(what, amqp_method_name(reply.reply.id));
    break;
  default:
    fail(what, "no reply");
  }
}

static long flows, nacked;
static int flow_active = 1;

/* Read frames until every publish up to ``last`` (delivery tag) is confirmed. */
static void wait_confirms(amqp_connection_state_t conn, uint64_t last) {
  static uint64_t confirmed;
  struct timeval timeout = {120, 0};
  while (confirmed < last) {
    amqp_frame_t frame;
    int status = amqp_simple_wait_frame_noblock(conn, &frame, &timeout);
    if (status != AMQP_STATUS_OK) fail("confirms", amqp_error_string2(status));
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    switch (frame.payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      amqp_basic_ack_t *ack = frame.payload.method.decoded;
      confirmed = ack->multiple ? ack->delivery_tag
                                : (ack->delivery_tag > confirmed ? ack->delivery_tag : confirmed);
      break;
    }
    case AMQP_BASIC_NACK_METHOD: {
      amqp_basic_nack_t *nack = frame.payload.method.decoded;
      nacked += nack->multiple ? (long)(nack->delivery_tag - confirmed) : 1;
      confirmed = nack->delivery_tag > confirmed ? nack->delivery_tag : confirmed;
      break;
    }
    case AMQP_CHANNEL_FLOW_METHOD: {
      amqp_channel_flow_t *flow = frame.payload.method.decoded;
      flows++;
      flow_active = flow->active != 0;
      emit("flow", "\"active\":%s,\"published\":%ld", flow_active ? "true" : "false",
           published);
      break;
    }
    case AMQP_CHANNEL_CLOSE_METHOD:
    case AMQP_CONNECTION_CLOSE_METHOD:
      fail("closed", amqp_method_name(frame.payload.method.id));
      break;
    default:
      emit("unexpected", "\"method\":\"%s\"", amqp_method_name(frame.payload.method.id));
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 7 || argc > 8) {
    fprintf(stderr, "usage: producer HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]\n");
    return 2;
  }
  const char *host = argv[1], *queue = argv[3];
  int port = atoi(argv[2]);
  long count = atol(argv[4]);
  double rate = atof(argv[5]);
  size_t size = (size_t)atol(argv[6]);
  int confirm = argc == 8 && strcmp(argv[7], "confirm") == 0;

  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t *socket = amqp_tcp_socket_new(conn);
  if (socket == NULL) fail("socket", "amqp_tcp_socket_new failed");
  int status = amqp_socket_open(socket, host, port);
  if (status != AMQP_STATUS_OK) fail("connect", amqp_error_string2(status));
  check_reply(amqp_login(conn, "/", 0, 131072, 30, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
              "login");
  amqp_channel_open(conn, 1);
  check_reply(amqp_get_rpc_reply(conn), "channel_open");
  if (confirm) {
    amqp_confirm_select(conn, 1);
    check_reply(amqp_get_rpc_reply(conn), "confirm_select");
  }
  emit("ready", "\"client\":\"rabbitmq-c\",\"version\":\"%s\",\"confirm\":%s", amqp_version(),
       confirm ? "true" : "false");

  char *payload = malloc(size + 11);
  amqp_bytes_t routing_key = amqp_cstring_bytes(queue);
  double start = now(), due = start, last_report = start;
  for (long seq = 0; seq < count; seq++) {
    if (rate > 0) {
      if (now() - due > 0.1) due = now(); /* held up: go on at RATE, no burst */
      double wait = due - now();
      if (wait > 0) usleep((useconds_t)(wait * 1e6)); /* pacing at RATE */
      due += 1.0 / rate;
    }
    char digits[24];
    snprintf(digits, sizeof digits, "%010ld", seq);
    memset(payload, 'x', size);
    memcpy(payload, digits, size < 10 ? size : 10);
    amqp_bytes_t message = {size, payload};
    status = amqp_basic_publish(conn, 1, amqp_empty_bytes, routing_key, 0, 0, NULL, message);
    if (status != AMQP_STATUS_OK) fail("publish", amqp_error_string2(status));
    published = seq + 1;
    if (confirm && published % BATCH == 0) wait_confirms(conn, (uint64_t)published);
    if (now() - last_report >= 0.1) {
      last_report = now();
      emit("progress", "\"published\":%ld", published);
    }
  }
  if (confirm) wait_confirms(conn, (uint64_t)published);
  amqp_queue_declare(conn, 1, routing_key, 1, 0, 0, 0, amqp_empty_table);
  check_reply(amqp_get_rpc_reply(conn), "rpc");
  /* a Channel.Flow that arrived during the RPC was queued by the library: report it too */
  while (amqp_frames_enqueued(conn)) {
    struct timeval zero = {0, 0};
    amqp_frame_t frame;
    if (amqp_simple_wait_frame_noblock(conn, &frame, &zero) != AMQP_STATUS_OK) break;
    if (frame.frame_type == AMQP_FRAME_METHOD &&
        frame.payload.method.id == AMQP_CHANNEL_FLOW_METHOD) {
      amqp_channel_flow_t *flow = frame.payload.method.decoded;
      flows++;
      flow_active = flow->active != 0;
      emit("flow", "\"active\":%s,\"published\":%ld", flow_active ? "true" : "false",
           published);
    }
  }
  emit("done",
       "\"published\":%ld,\"confirmed\":%s,\"nacked\":%ld,\"flows\":%ld,\"rpc_ok\":true,"
       "\"elapsed_s\":%.3f",
       published, confirm ? "true" : "false", nacked, flows, now() - start);
  free(payload);
  amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  return 0;
}
