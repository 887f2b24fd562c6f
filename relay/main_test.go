package relay

import (
	"os"
	"testing"

	"github.com/outboxd/outboxd/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	pgtest.Main(m)
}
