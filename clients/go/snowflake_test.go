package seq

import (
	"testing"
	"time"
)

// The same vectors as the Python decoder (seq.snowflake.decode) gives.
func TestDecodeMatchesTheWorkersLayout(t *testing.T) {
	cases := []struct {
		id       uint64
		time     string
		ms       int64
		worker   uint64
		sequence uint64
	}{
		{0, "2024-01-01T00:00:00.000Z", 0, 0, 0},
		{1, "2024-01-01T00:00:00.000Z", 0, 0, 1},
		{517815306035199, "2024-01-02T10:17:36.789Z", 123456789, 513, 4095},
		{9223372036854775807, "2093-09-06T15:47:35.551Z", 2199023255551, 1023, 4095},
	}
	for _, c := range cases {
		d, err := Decode(c.id, DefaultLayout)
		if err != nil {
			t.Fatal(err)
		}
		got := d.Time.Format("2006-01-02T15:04:05.000Z")
		if got != c.time || d.Ms != c.ms || d.Worker != c.worker || d.Sequence != c.sequence || d.ID != c.id {
			t.Errorf("Decode(%d) = %+v (%s), want %s ms=%d worker=%d sequence=%d", c.id, d, got, c.time, c.ms, c.worker, c.sequence)
		}
	}
}

func TestDecodeOtherLayouts(t *testing.T) {
	l := Layout{EpochMs: 0, TimeBits: 39, WorkerBits: 16, SequenceBits: 8}
	ms := int64(1 << 38)
	id := uint64(ms)<<24 | 65535<<8 | 7
	d, err := Decode(id, l)
	if err != nil {
		t.Fatal(err)
	}
	if d.Ms != ms || d.Worker != 65535 || d.Sequence != 7 || !d.Time.Equal(time.UnixMilli(ms)) {
		t.Fatalf("got %+v", d)
	}
}

func TestDecodeRefusesBadInput(t *testing.T) {
	if _, err := Decode(1<<63, DefaultLayout); err == nil {
		t.Error("an ID with the sign bit set was decoded")
	}
	for _, l := range []Layout{
		{TimeBits: 41, WorkerBits: 10, SequenceBits: 13},
		{TimeBits: 31, WorkerBits: 10, SequenceBits: 22},
		{TimeBits: 41, WorkerBits: 0, SequenceBits: 22},
		{TimeBits: 41, WorkerBits: 22, SequenceBits: 0},
		{EpochMs: -1, TimeBits: 41, WorkerBits: 10, SequenceBits: 12},
	} {
		if _, err := Decode(1, l); err == nil {
			t.Errorf("layout %+v accepted", l)
		}
	}
}
