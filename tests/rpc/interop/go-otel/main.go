// Go peer of tests/rpc/test_otel_interop.py: a trace that crosses Go rpcx and
// our rpc, with the OpenTelemetry plugins of github.com/rpcxio/rpcx-plugins
// (server/otel and client/otel, used as they are) on the Go side.
//
//	go-otel GO_LISTEN OUR_ADDR SERVICE METHOD ARGS_JSON
//
// serves Arith.Mul (JSON) on GO_LISTEN (host:port) with rpcx-plugins' server
// plugin, then calls SERVICE.METHOD(ARGS_JSON) on our server at OUR_ADDR
// (host:port) through an XClient with rpcx-plugins' client plugin, waits for
// the Go server's span of the call our server made back, and prints on
// stdout the reply (or "error: ...") on one line, then every finished span
// as one JSON array on one line. The spans are recorded by the OpenTelemetry
// SDK's in-memory exporter (sdk/trace/tracetest); the propagator is the
// global W3C trace context + baggage one, which the plugins use when given
// none.
//
//	go-otel decode-call < PAYLOAD
//
// decodes a juggler call payload (read from stdin) with encoding/json into
// the struct the original Go juggler's callee decodes it into (its
// msg.CallPayload: conn_uuid, msg_uuid, uri, args; the UUIDs as strings here
// instead of pborman/uuid, which changes nothing for unknown members) and
// prints the decoded fields as JSON: the check that the "trace" member our
// traced server adds is ignored by an original callee.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	clientotel "github.com/rpcxio/rpcx-plugins/client/otel"
	serverotel "github.com/rpcxio/rpcx-plugins/server/otel"
	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type Args struct {
	A int `json:"A"`
	B int `json:"B"`
}

type Reply struct {
	C int `json:"C"`
}

type Arith struct{}

func (t *Arith) Mul(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A * args.B
	return nil
}

// Span is what the test reads of one finished span.
type Span struct {
	Name              string            `json:"name"`
	Kind              string            `json:"kind"`
	TraceID           string            `json:"trace_id"`
	SpanID            string            `json:"span_id"`
	ParentSpanID      string            `json:"parent_span_id"`
	ParentRemote      bool              `json:"parent_remote"`
	Scope             string            `json:"scope"`
	Attributes        map[string]string `json:"attributes"`
	StatusCode        string            `json:"status_code"`
	StatusDescription string            `json:"status_description"`
}

func spansOf(exp *tracetest.InMemoryExporter) []Span {
	out := []Span{}
	for _, s := range exp.GetSpans() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		parent := ""
		if s.Parent.IsValid() {
			id := s.Parent.SpanID()
			parent = hex.EncodeToString(id[:])
		}
		tid, sid := s.SpanContext.TraceID(), s.SpanContext.SpanID()
		out = append(out, Span{
			Name:              s.Name,
			Kind:              s.SpanKind.String(),
			TraceID:           hex.EncodeToString(tid[:]),
			SpanID:            hex.EncodeToString(sid[:]),
			ParentSpanID:      parent,
			ParentRemote:      s.Parent.IsRemote(),
			Scope:             s.InstrumentationScope.Name,
			Attributes:        attrs,
			StatusCode:        s.Status.Code.String(),
			StatusDescription: s.Status.Description,
		})
	}
	return out
}

// callPayload mirrors the original juggler's msg.CallPayload (see the package doc).
type callPayload struct {
	ConnUUID string          `json:"conn_uuid"`
	MsgUUID  string          `json:"msg_uuid"`
	URI      string          `json:"uri"`
	Args     json.RawMessage `json:"args,omitempty"`
}

func decodeCall() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		panic(err)
	}
	var p callPayload
	if err := json.Unmarshal(raw, &p); err != nil {
		fmt.Fprintln(os.Stderr, "decode:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(p)
	fmt.Println(string(b))
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "decode-call" {
		decodeCall()
		return
	}
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: go-otel GO_LISTEN OUR_ADDR SERVICE METHOD ARGS_JSON")
		os.Exit(2)
	}
	listen, ours, service, method, rawArgs := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	s := server.NewServer()
	s.Plugins.Add(serverotel.NewOpenTelemetryPlugin(tp.Tracer("go-server"), nil))
	if err := s.RegisterName("Arith", new(Arith), ""); err != nil {
		panic(err)
	}
	go func() { _ = s.Serve("tcp", listen) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "the Go server did not start:", err)
			os.Exit(1)
		}
		time.Sleep(20 * time.Millisecond)
	}

	d, err := client.NewPeer2PeerDiscovery("tcp@"+ours, "")
	if err != nil {
		panic(err)
	}
	opt := client.DefaultOption
	opt.SerializeType = protocol.JSON
	xc := client.NewXClient(service, client.Failfast, client.RandomSelect, d, opt)
	plugins := client.NewPluginContainer()
	plugins.Add(clientotel.NewOpenTelemetryPlugin(tp.Tracer("go-client"), nil))
	xc.SetPlugins(plugins)

	var args map[string]any
	if err := json.Unmarshal([]byte(rawArgs), &args); err != nil {
		panic(err)
	}
	reply := map[string]any{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	callErr := xc.Call(ctx, method, args, &reply)
	cancel()
	xc.Close()
	if callErr != nil {
		fmt.Println("error:", callErr)
	} else {
		b, _ := json.Marshal(reply)
		fmt.Println(string(b))
	}

	// the Go server's span ends after it wrote its response (PostWriteResponse),
	// which may come just after our server answered the Go client
	if callErr == nil {
		deadline = time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			found := false
			for _, sp := range exp.GetSpans() {
				if sp.Name == "rpcx.service.Arith.Mul" {
					found = true
				}
			}
			if found {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = s.Close()
	_ = tp.ForceFlush(context.Background())
	// read before the provider's shutdown: shutting the in-memory exporter down empties it
	b, _ := json.Marshal(spansOf(exp))
	_ = tp.Shutdown(context.Background())
	fmt.Println(string(b))
}
