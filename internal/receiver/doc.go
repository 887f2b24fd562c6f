// Package receiver is a real HTTP receiver on loopback that enforces idempotency keys,
// the way Stripe does. Connector tests, the relay's tests, the `outboxd demo` command and
// the throughput benchmark deliver to it and then ask it what happened.
//
//	r, err := receiver.Start(receiver.Options{})
//	if err != nil {
//		return err
//	}
//	defer r.Close()
//	// deliver to r.URL() ...
//	fmt.Println(r.Effects("order-42:notify"), r.DuplicateKeys())
//
// # Semantics
//
// Every request is a POST that carries an Idempotency-Key header; one without gets 400.
// The first request for a key that gets past the key's [Plan] performs the effect: the
// receiver counts it, logs it as an [Effect] (body, headers, arrival time, a global
// sequence number) and stores its answer, 200 and {"received": key, "effect": n}. A later
// request with the same key gets the stored answer again, with the header
// "Idempotent-Replayed: true", and performs no effect, provided its body is the same; one
// with another body is another operation under a reused key and gets 422, as Stripe
// refuses a key reused with different parameters. While the first request for a key is
// still performing its effect, a concurrent one gets 409 Conflict and may retry.
//
// [Options.IgnoreKeys] turns the enforcement off: every request that gets past its plan
// performs an effect, as a receiver that does not honour the key would. That is the
// receiver a connector with the "forwarded" guarantee may face, and [Receiver.DuplicateKeys]
// then shows what a blind retry costs.
//
// # Plans
//
// [Receiver.Plan] scripts one key's answers, before or during a test: fail the first N
// requests with a 5xx (and a Retry-After), answer a 4xx forever, or perform the effect and
// then drop the connection without answering, which is the failure that matters most: the
// receiver acted, the sender cannot know. [Options.FailRate] adds seeded random 503s
// before any effect, for soak tests and the demo.
//
// # Signatures
//
// With [Options.Secret] set, requests must carry a valid Standard Webhooks signature
// (webhook-id, webhook-timestamp within five minutes, webhook-signature "v1,<base64>",
// or several separated by spaces, one of which matches), checked by an implementation
// independent of the webhook connector's; others get 401. [Options.Secrets] adds
// secrets that are accepted too, as a receiver holding the old and the new one while a
// sender rotates its secret.
//
// # Contention
//
// Per-key state lives in a sharded map, and no lock is held while reading a request or
// writing an answer, so the receiver keeps up with the relay's benchmark. The effect log
// takes one short lock per effect; [Options.NoEffectLog] drops it for runs of millions of
// rows.
package receiver
