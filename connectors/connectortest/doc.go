// Package connectortest is the conformance suite every connector kind passes, run against
// a real receiver on loopback (the webhook receiver, stripe-mock, an SMTP server, a fake
// Slack API).
//
// A connector's test describes the connector and how to ask its receiver what happened,
// then hands that to [Run] (connectors/webhook's TestConformance does exactly this):
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		r, err := receiver.Start(receiver.Options{})
//		require.NoError(t, err)
//		t.Cleanup(r.Close)
//		c, err := webhook.New(webhook.Config{URL: r.URL(), Guarantee: connectors.Enforced})
//		require.NoError(t, err)
//		connectortest.Run(t, connectortest.Harness{
//			Connector:           c,
//			PayloadFunc:         func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)) },
//			EffectsFunc:         r.Effects,
//			DropAfterEffectFunc: func(key string) { r.Plan(key, receiver.Plan{DropAfterEffect: 1}) },
//		})
//	}
//
// # What it checks
//
// The checks are parameterised by the guarantee the connector declares, because that is
// the promise the relay acts on:
//
//   - The guarantee is one of enforced, reconciled, forwarded.
//   - A delivery succeeds, returns a non-empty JSON result, and the receiver performed
//     exactly one effect under the very key it was given (a connector that rewrote the
//     key would show 0 effects for it).
//   - Delivering a delivered key again (a retry) succeeds; for enforced and reconciled
//     connectors it performs no second effect. The retry does not carry
//     PreviousAmbiguous: a reconciling connector looks on every attempt after the first.
//   - The failure that matters most: the receiver performs the effect and drops the
//     connection without answering. The attempt must fail without being marked permanent;
//     a forwarded connector must mark it ambiguous, so the relay can hold the row. The
//     retry, with the same key, succeeds, and for enforced and reconciled connectors the
//     effect happened exactly once.
//   - An attempt whose context is already cancelled fails, is not permanent (a relay
//     shutting down must not kill rows) and performs no effect.
//   - Deliveries of distinct keys, [Harness.Concurrency] at once, all succeed with one
//     effect each.
//
// Each check is a parallel subtest with keys of its own, so a receiver can be shared by
// all of them; keys are random per run, so a receiver that outlives the test binary
// (stripe-mock) never sees one twice.
package connectortest
