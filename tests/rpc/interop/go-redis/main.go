// Redis registry interop peer for tests/rpc/interop/test_redis_registry_interop.py:
// a Go rpcx server registered with rpcx's RedisRegisterPlugin, or a Go XClient
// discovering servers with rpcx-redis's RedisDiscovery (both over
// github.com/rpcxio/libkv's Redis store).
//
//	server ADDR REDIS BASE [group]  serve Arith.Mul / Arith.Add (JSON) on ADDR, registered
//	                                under BASE in the Redis at REDIS (host:port), with metadata
//	                                "group=NAME" when a group is given; prints "ready tcp@ADDR".
//	                                SIGTERM or SIGINT: Shutdown (which unregisters), then exit.
//	                                UPDATE_INTERVAL (a Go duration, default 1s) is the plugin's
//	                                UpdateInterval (the TTL is twice that); with METRICS=1 the
//	                                plugin gets a metrics registry and writes calls= and
//	                                connections= into the metadata at every update.
//	client REDIS BASE [group]       an XClient of Arith (failfast, random, JSON; Option.Group =
//	                                group) over rpcx-redis's discovery of BASE/Arith. Prints
//	                                "servers {JSON map address→metadata}" at start and at every
//	                                change the discovery reports; reads commands from stdin:
//	                                "call A B" prints "reply {JSON}" or "error MESSAGE";
//	                                "quit" or end of input exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metrics "github.com/rcrowley/go-metrics"
	redisclient "github.com/rpcxio/rpcx-redis/client"
	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
	"github.com/smallnest/rpcx/serverplugin"
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

func (t *Arith) Add(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A + args.B
	return nil
}

var out sync.Mutex

func say(format string, a ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", a...)
}

func serve(addr, redisAddr, base, group string) {
	interval := time.Second
	if v := os.Getenv("UPDATE_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic(err)
		}
		interval = d
	}
	plugin := &serverplugin.RedisRegisterPlugin{
		ServiceAddress: "tcp@" + addr,
		RedisServers:   []string{redisAddr},
		BasePath:       base,
		UpdateInterval: interval,
	}
	if os.Getenv("METRICS") == "1" {
		plugin.Metrics = metrics.NewRegistry()
	}
	if err := plugin.Start(); err != nil {
		panic(err)
	}
	s := server.NewServer()
	s.Plugins.Add(plugin)
	meta := ""
	if group != "" {
		meta = "group=" + group
	}
	if err := s.RegisterName("Arith", new(Arith), meta); err != nil {
		panic(err)
	}
	go func() {
		for s.Address() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		say("ready tcp@%s", s.Address().String())
	}()
	var stopping atomic.Bool
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		stopping.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx) // unregisters every service (the plugin deletes its keys)
		os.Exit(0)
	}()
	if err := s.Serve("tcp", addr); err != nil && err != server.ErrServerClosed && !stopping.Load() {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	select {} // Shutdown's goroutine exits the process
}

func printServers(pairs []*client.KVPair) {
	m := map[string]string{}
	for _, p := range pairs {
		m[p.Key] = p.Value
	}
	b, _ := json.Marshal(m)
	say("servers %s", b)
}

func call(redisAddr, base, group string) {
	d, err := redisclient.NewRedisDiscovery(base, "Arith", []string{redisAddr}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "discovery:", err)
		os.Exit(1)
	}
	watch := d.WatchService()
	printServers(d.GetServices())
	go func() {
		for pairs := range watch {
			printServers(pairs)
		}
	}()
	opt := client.DefaultOption
	opt.SerializeType = protocol.JSON
	opt.Group = group
	xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
	defer xc.Close()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "quit":
			return
		case "call":
			a, _ := strconv.Atoi(f[1])
			b, _ := strconv.Atoi(f[2])
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			reply := &Reply{}
			if err := xc.Call(ctx, "Mul", &Args{A: a, B: b}, reply); err != nil {
				say("error %v", err)
			} else {
				b, _ := json.Marshal(reply)
				say("reply %s", b)
			}
			cancel()
		default:
			say("error unknown command %q", f[0])
		}
	}
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: server ADDR REDIS BASE [group] | client REDIS BASE [group]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "server":
		if len(os.Args) < 5 {
			fmt.Fprintln(os.Stderr, "usage: server ADDR REDIS BASE [group]")
			os.Exit(2)
		}
		group := ""
		if len(os.Args) > 5 {
			group = os.Args[5]
		}
		serve(os.Args[2], os.Args[3], os.Args[4], group)
	case "client":
		group := ""
		if len(os.Args) > 4 {
			group = os.Args[4]
		}
		call(os.Args[2], os.Args[3], group)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}
