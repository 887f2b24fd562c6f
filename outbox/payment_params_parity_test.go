package outbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// README: "What the connector of the message's kind would refuse is invalid here
// already: a payload field it does not know ...". The payment connector refuses these
// payloads on the first attempt, permanently and without sending anything; Enqueue
// (prepare) must refuse them first instead of writing a row (perhaps one an approver
// approves) that can only go dead.
func TestPrepare_PaymentRefusesWhatTheConnectorRefuses(t *testing.T) {
	t.Parallel()
	c, err := payment.New(payment.Config{APIKey: "sk_test_x", APIBase: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, payload := range map[string]string{
		"UnknownParam":         `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","colour":"red"}}`,
		"MisspeltParam":        `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","paymentMethodTypes":["card"]}}`,
		"WrongType":            `{"operation":"payment_intent.create","params":{"amount":"2000","currency":"usd"}}`,
		"ConfirmWithoutID":     `{"operation":"payment_intent.confirm","params":{"payment_method":"pm_card_visa"}}`,
		"CancelIDNotAnID":      `{"operation":"payment_intent.cancel","params":{"id":"pi_1/../x"}}`,
		"NullMetadataValue":    `{"operation":"customer.create","params":{"metadata":{"a":null}}}`,
		"IDOnCreate":           `{"operation":"refund.create","params":{"id":"re_1","payment_intent":"pi_1"}}`,
		"MetadataValueOver500": `{"operation":"customer.create","params":{"metadata":{"a":"` + strings.Repeat("v", 501) + `"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, derr := c.Deliver(t.Context(), connectors.Delivery{Key: "k", Attempt: 1, Payload: json.RawMessage(payload)})
			if !connectors.IsPermanent(derr) {
				t.Fatalf("precondition: the connector should refuse %s permanently, got %v", payload, derr)
			}
			_, err := prepare(Message{Key: "k", Connector: "payment", Payload: json.RawMessage(payload)})
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("prepare accepted a payment payload the connector refuses without sending (%v)", derr)
			}
		})
	}
}
