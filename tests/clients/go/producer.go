// A producer on amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, 1.5.0), driven by
// tests/clients/harness.py. Prints one JSON object a line on stdout.
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o producer producer.go
//	producer HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]
//
// The same arguments and bodies as java/FloodProducer.java: RATE is messages a second, 0 = as
// fast as possible (held up for more than 100 ms, it goes on at RATE without a burst to catch
// up); publishes to the default exchange with routing key QUEUE (not declared here); each body
// starts with its sequence number in 10 ASCII digits, padded with 'x' to BODY_SIZE bytes. With
// confirm it waits for every outstanding confirm after each 100 publishes and at the end.
// After the last publish it makes one RPC (a passive declare of QUEUE): the channel still
// answers.
//
// Events: ready {client, properties}, flow {active, published} (Channel.NotifyFlow:
// the library replies FlowOk itself and keeps publishing; this program only reports it),
// progress {published} every 100 ms, error, done {published, confirmed, nacked, flows,
// rpc_ok, elapsed_s}.
//
// With FLOODWALL_CONNECTION_NAME set it names its connection the documented way
// (Config.Properties from NewConnectionProperties): amqp091-go then sends only what the
// application put there, no product, version or platform.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const batch = 100

var outMu sync.Mutex

func emit(event string, fields map[string]interface{}) {
	m := map[string]interface{}{"event": event, "t": float64(time.Now().UnixNano()) / 1e9}
	for k, v := range fields {
		m[k] = v
	}
	line, _ := json.Marshal(m)
	outMu.Lock()
	os.Stdout.Write(append(line, '\n'))
	outMu.Unlock()
}

func fail(kind string, err interface{}) {
	emit("error", map[string]interface{}{"kind": kind, "message": fmt.Sprint(err)})
	os.Exit(1)
}

func body(seq int64, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = 'x'
	}
	copy(b, fmt.Sprintf("%010d", seq))
	return b
}

func tableText(t amqp.Table) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range t {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

func main() {
	args := os.Args[1:]
	if len(args) < 6 || len(args) > 7 {
		fmt.Fprintln(os.Stderr, "usage: producer HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]")
		os.Exit(2)
	}
	host, port, queue := args[0], args[1], args[2]
	count, _ := strconv.ParseInt(args[3], 10, 64)
	rate, _ := strconv.ParseFloat(args[4], 64)
	size, _ := strconv.Atoi(args[5])
	confirm := len(args) == 7 && args[6] == "confirm"

	config := amqp.Config{Heartbeat: 30 * time.Second}
	if name := os.Getenv("FLOODWALL_CONNECTION_NAME"); name != "" {
		config.Properties = amqp.NewConnectionProperties()
		config.Properties["connection_name"] = name
	}
	conn, err := amqp.DialConfig(fmt.Sprintf("amqp://guest:guest@%s:%s/", host, port), config)
	if err != nil {
		fail("connect", err)
	}
	var closing atomic.Bool
	go func() {
		if e, ok := <-conn.NotifyClose(make(chan *amqp.Error, 1)); ok && !closing.Load() {
			fail("connection", e)
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		fail("channel", err)
	}
	go func() {
		if e, ok := <-ch.NotifyClose(make(chan *amqp.Error, 1)); ok && !closing.Load() {
			fail("channel", e)
		}
	}()
	var confirms chan amqp.Confirmation
	if confirm {
		if err := ch.Confirm(false); err != nil {
			fail("confirm_select", err)
		}
		confirms = ch.NotifyPublish(make(chan amqp.Confirmation, batch+1))
	}
	var published, flows int64
	// NotifyFlow is served from the connection's reader: drain it at once.
	flow := ch.NotifyFlow(make(chan bool, 16))
	go func() {
		for active := range flow {
			atomic.AddInt64(&flows, 1)
			emit("flow", map[string]interface{}{"active": active,
				"published": atomic.LoadInt64(&published)})
		}
	}()
	// "properties": what the application set (empty: the library sends its own product,
	// version and platform; the broker's connection record shows what arrived).
	emit("ready", map[string]interface{}{"client": "amqp091-go",
		"properties": tableText(config.Properties), "confirm": confirm})
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				emit("progress", map[string]interface{}{"published": atomic.LoadInt64(&published)})
			}
		}
	}()

	var nacked, unconfirmed int64
	waitConfirms := func() {
		for ; unconfirmed > 0; unconfirmed-- {
			select {
			case c, ok := <-confirms:
				if !ok {
					fail("confirms", "confirm channel closed")
				}
				if !c.Ack {
					nacked++
				}
			case <-time.After(120 * time.Second):
				fail("confirms", "no confirm within 120 s")
			}
		}
	}
	start := time.Now()
	due := start
	for seq := int64(0); seq < count; seq++ {
		if rate > 0 {
			if time.Since(due) > 100*time.Millisecond {
				due = time.Now() // held up: go on at RATE, no burst
			}
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait) // pacing at RATE
			}
			due = due.Add(time.Duration(float64(time.Second) / rate))
		}
		err := ch.Publish("", queue, false, false, amqp.Publishing{Body: body(seq, size)})
		if err != nil {
			fail("publish", err)
		}
		atomic.StoreInt64(&published, seq+1)
		if confirm {
			unconfirmed++
			if unconfirmed >= batch {
				waitConfirms()
			}
		}
	}
	if confirm {
		waitConfirms()
	}
	_, rpcErr := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if rpcErr != nil {
		fail("rpc", rpcErr)
	}
	close(done)
	emit("done", map[string]interface{}{"published": atomic.LoadInt64(&published),
		"confirmed": confirm, "nacked": nacked, "flows": atomic.LoadInt64(&flows),
		"rpc_ok": true, "elapsed_s": time.Since(start).Seconds()})
	closing.Store(true)
	ch.Close()
	conn.Close()
}
