package pgtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"
)

// containerImage is the image started when a Docker engine answers.
const containerImage = "postgres:17-alpine"

// dockerProbeTimeout bounds the check for a Docker engine. An engine that answers does so
// in milliseconds; the usual case without one (no socket) fails at once.
const dockerProbeTimeout = 2 * time.Second

// dockerAnswers reports whether a Docker engine responds to a ping. It never panics:
// testcontainers-go panics in a few places when it cannot work out the Docker host, and
// a missing engine must only mean falling through to the local binaries.
func dockerAnswers(ctx context.Context, verbose bool) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	if !verbose {
		// testcontainers-go prints its Docker details and every step to stderr.
		tclog.SetDefault(tclog.NewNoopLogger())
	}
	ctx, cancel := context.WithTimeout(ctx, dockerProbeTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return false
	}
	defer cli.Close()
	_, err = cli.Ping(ctx, client.PingOptions{})
	return err == nil
}

// startContainer starts PostgreSQL in a container, tuned for tests like pgcluster's
// throwaway clusters are.
func startContainer(ctx context.Context) (s *server, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctr, err := tcpostgres.Run(ctx, containerImage,
		testcontainers.WithCmd("postgres",
			"-c", "fsync=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=300",
			"-c", "shared_buffers=128MB",
		),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(ctr))
		}
		return nil, fmt.Errorf("start %s container: %w", containerImage, err)
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container DSN: %w", err), testcontainers.TerminateContainer(ctr))
	}
	return &server{
		dsn:  dsn,
		stop: func() error { return testcontainers.TerminateContainer(ctr) },
		// The reaper (Ryuk) connection lives as long as the process, by design: it is
		// how the container gets removed even if this process is killed. The Docker
		// client that testcontainers-go caches keeps idle HTTP connections to the engine.
		leakOpts: []goleak.Option{
			goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		},
	}, nil
}
