package connectors_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

func TestClassification(t *testing.T) {
	t.Parallel()
	base := errors.New("receiver answered 503")

	require.False(t, connectors.IsPermanent(base))
	require.False(t, connectors.IsAmbiguous(base))
	_, ok := connectors.RetryDelay(base)
	require.False(t, ok)

	perm := fmt.Errorf("deliver: %w", connectors.Permanent(base))
	require.True(t, connectors.IsPermanent(perm))
	require.ErrorIs(t, perm, base)
	require.Equal(t, "deliver: receiver answered 503", perm.Error())

	delayed := connectors.Ambiguous(connectors.RetryAfter(base, 3*time.Second))
	require.True(t, connectors.IsAmbiguous(delayed))
	require.False(t, connectors.IsPermanent(delayed))
	d, ok := connectors.RetryDelay(delayed)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, d)

	joined := errors.Join(errors.New("other"), connectors.Permanent(base))
	require.True(t, connectors.IsPermanent(joined))

	require.NoError(t, connectors.Permanent(nil))
	require.NoError(t, connectors.RetryAfter(nil, time.Second))
	require.NoError(t, connectors.Ambiguous(nil))

	set := connectors.Set{}
	_, err := set.Get("webhook")
	require.ErrorIs(t, err, connectors.ErrUnknownConnector)
}
