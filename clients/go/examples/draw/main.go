// Command draw prints IDs of a seq sequence, one per line.
//
//	go run ./examples/draw -servers 127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 -name orders -count 5
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"juggler-suite/seq"
)

func main() {
	servers := flag.String("servers", "127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003", "the cluster's members, HOST:PORT,...")
	name := flag.String("name", "orders", "the sequence")
	count := flag.Int("count", 5, "how many IDs")
	buf := flag.Uint64("buf", 100, "IDs fetched at a time")
	flag.Parse()

	client, err := seq.Dial(strings.Split(*servers, ","))
	if err != nil {
		fmt.Fprintln(os.Stderr, "draw:", err)
		os.Exit(2)
	}
	defer client.Close()
	s := client.Sequence(*name, seq.WithBufSize(*buf))
	for i := 0; i < *count; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		id, err := s.Next(ctx)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "draw:", err)
			os.Exit(1)
		}
		fmt.Println(id)
	}
}
