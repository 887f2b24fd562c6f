package payment_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

func TestKeyWindowIsStripes24Hours(t *testing.T) {
	t.Parallel()
	c, err := payment.New(payment.Config{APIKey: "sk_test_123", APIBase: "http://127.0.0.1:1"})
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, connectors.KeyWindow(c))
}
