package sqltool

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolgate/toolgate/builtin"
)

// The memory tests run each query in a child process (this test binary,
// TestMemoryHelperProcess) and read the child's peak resident set size
// from the kernel (getrusage maxrss), so that memory SQLite allocates
// outside the Go heap counts too, and nothing else in the test process
// does.

// memHelperEnv carries a memJob to the child process.
const memHelperEnv = "TOOLGATE_SQLTOOL_MEM_HELPER"

// memJob is what the child runs: Parallel calls of sql.query with Query
// at once, on a database opened from Config, with a result cap of
// ResultMaxKiB.
type memJob struct {
	Config       Config `json:"config"`
	Query        string `json:"query"`
	Parallel     int    `json:"parallel"`
	ResultMaxKiB int    `json:"result_max_kib"`
}

// memOutcome is one call's outcome, as the child reports it.
type memOutcome struct {
	Err       string `json:"err,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Rows      int    `json:"rows"`
	Bytes     int    `json:"bytes"`
	Tail      string `json:"tail"` // the last line of Content
}

// TestMemoryHelperProcess is the child of the memory tests; it does
// nothing in a normal run.
func TestMemoryHelperProcess(t *testing.T) {
	spec := os.Getenv(memHelperEnv)
	if spec == "" {
		t.Skip("the child process of TestResultMemoryBounded")
	}
	var job memJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := Open(ctx, job.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tl := toolsFor(t, db, &Options{Options: builtin.Options{ResultMaxKiB: job.ResultMaxKiB}})[QueryName]
	out := make([]memOutcome, job.Parallel)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			r, err := tl.Run(ctx, inv(map[string]string{"query": job.Query}))
			if err != nil {
				out[i] = memOutcome{Err: err.Error()}
				return
			}
			lines := strings.Split(r.Content, "\n")
			out[i] = memOutcome{Truncated: r.Truncated, Rows: len(r.Structured.(QueryResult).Rows), Bytes: r.Bytes, Tail: lines[len(lines)-1]}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(out)
	fmt.Printf("\nOUTCOME %s\n", b)
}

// runMemJob runs job in a child process and returns its outcomes and its
// peak resident set size in MiB.
func runMemJob(t *testing.T, job memJob) ([]memOutcome, int64) {
	t.Helper()
	spec, _ := json.Marshal(job)
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), memHelperEnv+"="+string(spec), "GOMAXPROCS=2")
	outb, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, outb)
	}
	var got []memOutcome
	for _, l := range strings.Split(string(outb), "\n") {
		if s, ok := strings.CutPrefix(l, "OUTCOME "); ok {
			if err := json.Unmarshal([]byte(s), &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got == nil {
		t.Fatalf("the child reported nothing:\n%s", outb)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return got, ru.Maxrss / 1024 // KiB on Linux
}

// memCase is one shape of a large result.
type memCase struct {
	name    string
	driver  string
	query   string
	maxRows int
	// want is how the call ends: "truncated" (rows cut to the cap, the
	// cut marked) or "error" (the call fails saying which bound a value
	// or row passed).
	want string
}

// columns repeats expr n times as the columns of one SELECT list.
func columns(expr string, n int) string {
	cols := make([]string, n)
	for i := range cols {
		cols[i] = fmt.Sprintf("%s AS c%d", expr, i)
	}
	return strings.Join(cols, ", ")
}

// memCases are results far larger than the 64 KiB cap, in every shape:
// many rows, one huge value, many columns, many large values inside one
// column's expression (SQLite keeps each constant subexpression in its
// own register), and values that grow when decoded (PostgreSQL numerics
// sent in binary).
func memCases() []memCase {
	var terms []string
	for i := range 300 {
		terms = append(terms, fmt.Sprintf("length(zeroblob(1000000)||'%d')", i))
	}
	var groups []string
	for i := 0; i < len(terms); i += 100 {
		groups = append(groups, "max("+strings.Join(terms[i:i+100], ",")+")")
	}
	return []memCase{
		{"many rows", DriverSQLite, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) SELECT x, hex(zeroblob(100000)) FROM c", 1000, "truncated"},
		{"one huge value", DriverSQLite, "SELECT hex(zeroblob(8000000))", 0, "error"},
		{"many columns", DriverSQLite, "SELECT " + columns("hex(zeroblob(500000))", 50), 0, "error"},
		{"many values in one column", DriverSQLite, "SELECT max(" + strings.Join(groups, ", ") + ")", 0, "error"},
		{"many rows", DriverPostgres, "SELECT repeat('x', 1000000) FROM generate_series(1, 300)", 1000, "truncated"},
		{"one huge value", DriverPostgres, "SELECT repeat('x', 50000000)", 0, "error"},
		{"many columns", DriverPostgres, "SELECT " + columns("repeat('x', 1000000)", 100), 0, "error"},
		{"values that grow when decoded", DriverPostgres, "SELECT array_fill(10::numeric ^ 131071, ARRAY[1000])", 0, "error"},
	}
}

// TestResultMemoryBounded runs results far larger than the cap, three
// calls at once, and checks that the process running them stays within a
// few MiB of its idle size (the bound fails without the reading limits:
// from 200 MiB to over 1 GiB), and that each call is cut or fails with a
// message naming the bound.
func TestResultMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	const parallel = 3
	const boundMiB = 64 // over the idle child
	cfgs := map[string]Config{DriverSQLite: {Name: "shop", Driver: DriverSQLite, Path: sqliteFile(t)}}
	if os.Getenv("TOOLGATE_PG_DSN") != "off" {
		cfgs[DriverPostgres] = Config{Name: "shop", Driver: DriverPostgres, DSN: pgDSN(t)}
	}
	idle := map[string]int64{}
	for d, cfg := range cfgs {
		_, idle[d] = runMemJob(t, memJob{Config: cfg, Query: "SELECT 1", Parallel: parallel, ResultMaxKiB: 64})
		t.Logf("%s: idle child peak %d MiB", d, idle[d])
	}
	for _, tc := range memCases() {
		cfg, ok := cfgs[tc.driver]
		if !ok {
			continue
		}
		t.Run(tc.driver+"/"+tc.name, func(t *testing.T) {
			cfg.MaxRows = tc.maxRows
			cfg.StatementTimeout = 60 * time.Second // the machine may be busy; the bound is on memory
			got, peak := runMemJob(t, memJob{Config: cfg, Query: tc.query, Parallel: parallel, ResultMaxKiB: 64})
			t.Logf("peak %d MiB (idle %d MiB); outcomes %+v", peak, idle[tc.driver], got[0])
			if peak-idle[tc.driver] > boundMiB {
				t.Errorf("peak %d MiB, more than %d MiB over the idle %d MiB", peak, boundMiB, idle[tc.driver])
			}
			for _, o := range got {
				switch tc.want {
				case "truncated":
					if o.Err != "" || !o.Truncated || o.Bytes > 64<<10 || !strings.Contains(o.Tail, "larger than the 65536-byte cap") {
						t.Errorf("want a result cut to the cap, marked: %+v", o)
					}
				case "error":
					if !strings.Contains(o.Err, "larger than") || !strings.Contains(o.Err, "narrow the query") {
						t.Errorf("want an error naming the bound: %+v", o)
					}
				}
			}
		})
	}
}
