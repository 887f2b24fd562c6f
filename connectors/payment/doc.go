// Package payment is the connector that performs Stripe API calls named by rows,
// through stripe-go, with the row's key as Stripe's idempotency key.
//
// # Payload
//
// A row's payload names the operation and its parameters, spelt as the Stripe API
// spells them:
//
//	{"operation": "payment_intent.create",
//	 "params": {"amount": 2000, "currency": "usd", "payment_method_types": ["card"],
//	            "metadata": {"order": "42"}}}
//
// The operations are
//
//	payment_intent.create   POST /v1/payment_intents
//	payment_intent.confirm  POST /v1/payment_intents/{id}/confirm   params must hold "id"
//	payment_intent.cancel   POST /v1/payment_intents/{id}/cancel    params must hold "id"
//	refund.create           POST /v1/refunds
//	customer.create         POST /v1/customers
//
// The params are decoded into stripe-go's params struct for the call
// (stripe.PaymentIntentCreateParams and so on), matching keys by the struct's form
// tags, so a parameter stripe-go does not know, or a value of the wrong JSON type, is
// refused before anything is sent. A row cannot set request options (idempotency key,
// headers, connected account).
//
// The row's own headers ([connectors.Delivery.Headers], such as traceparent) are not
// sent to Stripe either: Stripe reads request headers as options (Stripe-Account acts on
// a connected account, Stripe-Version changes the API's answers), and the API key comes
// only from configuration.
//
// # Idempotency
//
// Every attempt sends Idempotency-Key: <the row's key>, the same on each attempt. Stripe
// stores its answer against the key for at least 24 hours and replays it to a request
// with the same key and parameters, so the connector declares [connectors.Enforced]. The
// key must be 1–255 bytes without surrounding whitespace, as Stripe requires.
//
// stripe-go's own network retries are off (MaxNetworkRetries 0), and so is net/http's
// silent resend of a request whose connection died: the relay owns retries, and every
// attempt it counts is one request. stripe-go's logging is off too; failures come back
// as errors.
//
// # Outcomes
//
// When Stripe answers with an object, the stored result is
//
//	{"object": "payment_intent", "id": "pi_…", "status": "succeeded", "livemode": false,
//	 "amount": 2000, "currency": "usd", "idempotent_replayed": true}
//
// where status, livemode, amount and currency appear when the object has them (a
// Refund has no livemode), and idempotent_replayed when Stripe answered from its store
// (an earlier attempt did the work). A card_error (HTTP 402) is an outcome too, not a failure: the attempt happened,
// and Stripe replays the same decline for the same key. Deliver returns no error and the
// result
//
//	{"object": "error", "type": "card_error", "code": "card_declined",
//	 "decline_code": "insufficient_funds", "message": "…", "payment_intent": "pi_…"}
//
// Any other answer carrying a Stripe error object that is final for the key (a permanent
// failure, or a 5xx) is stored too, with the error: Stripe saves it against the key once
// the request began to run and replays it ([ErrorAnswer]). An answer to retry (409, 408,
// 425, 429, Stripe-Should-Retry: true) is not: Stripe saved nothing for the key.
//
//	{"object": "error", "status": 400, "type": "invalid_request_error",
//	 "code": "amount_too_small", "param": "amount", "message": "…", "request_id": "req_…"}
//
// Other failures are classified for the relay:
//
//   - 409 (another request with the same key is still running, which Stripe reports as
//     an idempotency_error), 408, 425, 429, 5xx and api_error are retried, no sooner than
//     a Retry-After header says when there is one ([connectors.RetryAfter]). So is any
//     answer carrying Stripe-Should-Retry: true. A 5xx or api_error leaves Stripe's
//     outcome unknown, so it is also [connectors.Ambiguous]; once Stripe answers a retry
//     with the 500 it saved for the key (Idempotent-Replayed: true), that is final too.
//     A 409 is ambiguous as well: the request still running (an earlier attempt whose
//     answer was lost) may act, so a row whose attempts run out on 409s ends dead marked
//     ambiguous.
//   - An answer carrying Stripe-Should-Retry: false is final, as for Stripe's own
//     libraries (a retry would replay it): permanent (a 409 too), and also ambiguous
//     for a 5xx or api_error.
//   - 3xx is permanent: redirects are not followed. So is 101 Switching Protocols, whose
//     connection is closed unread: it is no answer to an API call.
//   - idempotency_error otherwise (the key was used with other parameters),
//     invalid_request_error and other 4xx are permanent ([connectors.Permanent]), with
//     Stripe's message.
//   - A 4xx whose body is lost on the way (the connection drops, or the time limit
//     strikes, after the status line) is retried, as stripe-go retries a failed read: the
//     status alone does not tell a card decline from a refused request, nor what to fix,
//     and Stripe answers the same key again in full (it replays an answer it saved, and
//     checks again a request it saved nothing for). A 409 so cut short is ambiguous as
//     well, as a whole one is.
//   - An unknown operation, a payload or params that do not decode, a missing or
//     malformed "id" (letters, digits and '_' only), a metadata key that is empty or holds
//     square brackets, metadata over Stripe's limits (50 keys, keys of 40 characters,
//     values of 500), or a key Stripe would refuse are permanent, and nothing is sent.
//     [CheckPayload] tells the payload's faults apart without sending; it is registered
//     for outbox.Enqueue, which refuses such keys itself. A whole number written with a fraction or an exponent (2000.0,
//     2e3) goes into an integer parameter as that integer.
//   - Network errors and timeouts are retried. Once the request was written it may
//     have reached Stripe, so those are also marked [connectors.Ambiguous]; Stripe
//     enforces the key, so the retry is safe. A failure before any of the request left
//     (a keep-alive connection reset before the flush, a refused TLS handshake: see
//     [connectors.TraceSend]) is not ambiguous. An answer
//     that cannot be read (a 2xx body that is not a Stripe object) is ambiguous too.
//
// Messages name the operation and the API base, never the API key; [Config] and
// [Connector] redact the key in fmt and log/slog output.
//
// # Testing
//
// Tests run against stripe-mock (https://github.com/stripe/stripe-mock) on loopback,
// and against a fake Stripe in the test that enforces keys the way Stripe does, to
// script dropped connections and error answers. Install stripe-mock with
//
//	go install github.com/stripe/stripe-mock@v0.203.0
package payment
