// Package stripemocktest runs stripe-mock, Stripe's API stand-in, on loopback for tests:
// the payment connector's own, and the end-to-end ones that run every connector.
package stripemocktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Hint is the one line a test failure shows when stripe-mock is missing.
const Hint = "stripe-mock not found on PATH or in $(go env GOPATH)/bin; install it with: make stripe-mock (go install github.com/stripe/stripe-mock@v0.203.0)"

// Start runs stripe-mock on loopback for the test and returns its HTTP base URL. It is
// stopped at cleanup. The ports are found free and then given to stripe-mock, so another
// process may take one in between: a stripe-mock that exits before it answers is started
// again on other ports, up to three times.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := find()
	if err != nil {
		t.Fatal(Hint)
	}
	var lost error
	for range 3 {
		base, err := run(t, bin)
		if err == nil {
			return base
		}
		lost = err
	}
	t.Fatal(lost)
	return ""
}

// output is stripe-mock's output, written by its process's copiers while a failing test
// may read it.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// run starts stripe-mock on two free ports and waits until it answers. It returns an
// error when stripe-mock exits first (a port taken meanwhile, say), and fails the test
// when it neither answers nor exits.
func run(t testing.TB, bin string) (string, error) {
	t.Helper()
	httpPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	httpsPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	var out output
	// Not CommandContext(t.Context()): the cleanup below stops it and waits, so it is
	// never left running past the test whatever happens.
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:"+httpPort, "-https-addr", "127.0.0.1:"+httpsPort)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("stripe-mock output:\n%s", out.String())
		}
	})

	base := "http://127.0.0.1:" + httpPort
	// Wait until it answers: loading its OpenAPI spec takes a moment. The deadline is
	// generous; it bounds a hang, it is not a timing assertion.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			return "", fmt.Errorf("stripe-mock exited before answering: %v\n%s", err, out.String())
		default:
		}
		if answers(t.Context(), base) {
			return base, nil
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not answer on %s\n%s", base, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func find() (string, error) {
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "stripe-mock")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("stripe-mock not found")
}

func answers(ctx context.Context, base string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/customers", nil)
	if err != nil {
		return false
	}
	req.SetBasicAuth("sk_test_123", "")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port), nil
}
