package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"net/textproto"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/outboxd/outboxd/connectors"
)

// MaxKeyLength is the longest idempotency key, and ordering key, in characters.
const MaxKeyLength = 255

// Kinds are the connector kinds the relay knows. A connector instance is a kind, or a kind
// and a name joined by a colon ("webhook:crm"); a named instance validates as its kind.
var Kinds = []string{"webhook", "email", "slack", "payment"}

// PaymentOperations are the payment operations a payment intent may name.
var PaymentOperations = []string{
	"payment_intent.create",
	"payment_intent.confirm",
	"payment_intent.cancel",
	"refund.create",
	"customer.create",
}

// MinTimestamp is the earliest time PostgreSQL's timestamptz holds, 4714-11-24 BC
// (UTC); a Message's NotBefore may be as early, and must be before 294277-01-01.
var MinTimestamp = time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)

// maxTimestamp is the first time after timestamptz's range.
var maxTimestamp = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)

var (
	connectorPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*(:[a-z0-9_]+)?$`)
	headerPattern    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	errTrailingData  = errors.New("unexpected data after the JSON value")
)

// ValidConnectorName reports whether the outbox table's connector column can hold name
// (its CHECK constraint): a kind, or kind:name, of lowercase letters, digits and '_',
// starting with a letter, at most 100 characters. The kind itself is not checked.
func ValidConnectorName(name string) bool {
	return len(name) <= 100 && connectorPattern.MatchString(name)
}

// ConnectorKind returns the kind of a connector instance: "webhook" for "webhook:crm".
func ConnectorKind(connector string) string {
	kind, _, _ := strings.Cut(connector, ":")
	return kind
}

// prepared is a validated message, ready to write.
type prepared struct {
	Message
	payload     []byte // the JSON text to store
	fingerprint []byte
}

// prepare validates m and computes what Enqueue writes. Its errors wrap ErrInvalidMessage.
func prepare(m Message) (prepared, error) {
	p := prepared{Message: m}
	if err := checkKey(m.Key); err != nil {
		return p, err
	}
	if err := checkConnector(m.Connector); err != nil {
		return p, err
	}
	if kind := ConnectorKind(m.Connector); kind != "slack" {
		// The key travels as a header (Idempotency-Key; Stripe's, a mail's): refused now
		// rather than sent to dead by the connector on its first attempt.
		if problem := connectors.KeyHeaderProblem(m.Key); problem != "" {
			return p, invalid("idempotency key %q cannot be sent by the %s connector: %s", m.Key, kind, problem)
		}
	}
	if ConnectorKind(m.Connector) == "payment" {
		// Stripe counts bytes, and the payment connector refuses a key with any Unicode
		// white space at either end.
		if len(m.Key) > MaxKeyLength {
			return p, invalid("idempotency key is %d bytes; the payment connector (Stripe) accepts at most %d bytes", len(m.Key), MaxKeyLength)
		}
		if strings.TrimSpace(m.Key) != m.Key {
			return p, invalid("idempotency key %q begins or ends with white space, which the payment connector refuses", m.Key)
		}
	}
	// No byte limit for email here: only the Resend transport has one (256 bytes), and
	// enqueue cannot tell which transport delivers; the SMTP transport takes any key.
	if err := checkOrderingKey(m.OrderingKey); err != nil {
		return p, err
	}
	// The headers' jsonb, bounded as checkStorable bounds a payload's: counted first,
	// before the values are read.
	var headersData int64
	for name, value := range m.Headers {
		headersData += int64(len(name) + len(value))
	}
	headersSize := jsonbContainerSize(2*len(m.Headers), headersData) + jsonbTopSize
	if len(m.Headers) > jsonbMaxMembers || headersSize > jsonbMaxLen {
		return p, invalid("headers take more than PostgreSQL's jsonb can store (%d of them, about %d bytes; at most %d and %d)",
			len(m.Headers), headersSize, jsonbMaxMembers, jsonbMaxLen)
	}
	for name, value := range m.Headers {
		if !headerPattern.MatchString(name) {
			return p, invalid("header name %q must be lowercase letters, digits and '-'", name)
		}
		if !connectors.ValidHeaderValue(value) || !utf8.ValidString(value) {
			return p, invalid("header %q has a value with a line break or invalid characters", name)
		}
	}

	if !utf8.ValidString(m.CreatedBy) || strings.ContainsRune(m.CreatedBy, 0) {
		return p, invalid("created_by is not valid UTF-8 or contains a NUL character")
	}
	if !m.NotBefore.IsZero() && (m.NotBefore.Before(MinTimestamp) || !m.NotBefore.Before(maxTimestamp)) {
		return p, invalid("not_before %s is outside PostgreSQL's timestamptz range", m.NotBefore.UTC().Format(time.RFC3339))
	}

	raw, v, err := storedPayload(m.Payload)
	if err != nil {
		return p, err
	}
	if err := checkPayload(ConnectorKind(m.Connector), v); err != nil {
		return p, err
	}
	// What the connector itself would refuse on every attempt, where its package is part
	// of this program (outboxd's API and MCP, for one).
	if err := connectors.CheckPayload(ConnectorKind(m.Connector), raw); err != nil {
		return p, invalid("%s payload: %v", ConnectorKind(m.Connector), err)
	}
	p.payload = raw
	p.fingerprint = fingerprint(m.Connector, m.OrderingKey, canonicalJSON(v))
	return p, nil
}

// lookupForm is m's request as the outbox table holds and compares it (its payload's
// JSON text and fingerprint), for a message that [prepare] refused: a row written before
// the rule that refuses it (by an older outboxd, or by plain SQL, which only the table's
// constraints check) may hold the same request, which is then the message's answer, as
// for any request asked again. false when no row can hold m's key, connector, ordering
// key and payload, or when looking them up would fail (and abort the caller's
// transaction).
func lookupForm(m Message) (prepared, bool) {
	p := prepared{Message: m}
	if checkKey(m.Key) != nil || !ValidConnectorName(m.Connector) || checkOrderingKey(m.OrderingKey) != nil {
		return p, false
	}
	raw, v, err := storedPayload(m.Payload)
	if err != nil {
		return p, false
	}
	p.payload, p.fingerprint = raw, fingerprint(m.Connector, m.OrderingKey, canonicalJSON(v))
	return p, true
}

// checkOrderingKey refuses an ordering key that no row can hold.
func checkOrderingKey(k string) error {
	if n := utf8.RuneCountInString(k); n > MaxKeyLength {
		return invalid("ordering key is %d characters; the limit is %d", n, MaxKeyLength)
	}
	if !utf8.ValidString(k) || strings.ContainsRune(k, 0) {
		return invalid("ordering key is not valid UTF-8 or contains a NUL character")
	}
	return nil
}

// storedPayload returns payload's JSON text, which the table stores, and its decoded
// value, or why the table cannot hold it (an error wrapping ErrInvalidMessage).
func storedPayload(payload any) (raw []byte, v any, err error) {
	if raw, err = payloadJSON(payload); err != nil {
		return nil, nil, err
	}
	if what := jsonbCounts(raw); what != "" && json.Valid(raw) {
		return nil, nil, invalid("payload holds %s, which PostgreSQL's jsonb cannot store", what)
	}
	if v, err = decodeJSON(raw); err != nil {
		return nil, nil, invalid("payload is not valid JSON: %v", err)
	}
	if what := jsonbRefuses(raw); what != "" {
		return nil, nil, invalid("payload holds %s, which PostgreSQL's jsonb cannot store", what)
	}
	st := checkStorable(v)
	if st.refused != "" {
		return nil, nil, invalid("payload holds the number %s, which PostgreSQL's numeric cannot hold (at most 131072 digits before the point and 16383 after it)", st.refused)
	}
	if st.tooLarge != "" {
		return nil, nil, invalid("payload holds %s, which PostgreSQL's jsonb cannot store", st.tooLarge)
	}
	if st.writtenOut > maxWrittenOut {
		return nil, nil, invalid("payload holds numbers that PostgreSQL writes out in full, as it does at every claim of the row, "+
			"in more than %d MiB beyond what is written (0e-16383 as \"0.\" and 16383 zeros, 1e300 as a 1 and 300 zeros); "+
			"send such numbers as strings", maxWrittenOut>>20)
	}
	return raw, v, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidMessage, fmt.Sprintf(format, args...))
}

func checkKey(key string) error {
	switch n := utf8.RuneCountInString(key); {
	case key == "":
		return invalid("idempotency key is empty; derive one from the work with outbox.Key")
	case !utf8.ValidString(key):
		return invalid("idempotency key is not valid UTF-8")
	case n > MaxKeyLength:
		return invalid("idempotency key is %d characters; the limit is %d", n, MaxKeyLength)
	case strings.ContainsRune(key, 0):
		return invalid("idempotency key contains a NUL character")
	}
	return nil
}

func checkConnector(connector string) error {
	if connector == "" {
		return invalid("connector is empty; name one of %s, or a named instance such as webhook:crm", strings.Join(Kinds, ", "))
	}
	if !ValidConnectorName(connector) {
		return invalid("connector %q is malformed; use a kind such as webhook, or kind:name with lowercase letters, digits and '_'", connector)
	}
	kind := ConnectorKind(connector)
	for _, k := range Kinds {
		if k == kind {
			return nil
		}
	}
	return invalid("connector %q has unknown kind %q; known kinds are %s", connector, kind, strings.Join(Kinds, ", "))
}

// payloadJSON turns a Message payload into JSON text: []byte and json.RawMessage are taken
// as JSON already; anything else is marshalled with encoding/json.
func payloadJSON(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case nil:
		return nil, invalid("payload is missing")
	case json.RawMessage:
		return p, nil
	case []byte:
		return p, nil
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, invalid("payload cannot be encoded as JSON: %v", err)
		}
		return b, nil
	}
}

// checkPayload applies the rules of a connector kind to a decoded payload.
func checkPayload(kind string, v any) error {
	switch kind {
	case "webhook":
		switch v.(type) {
		case map[string]any, []any:
			return nil
		}
		return invalid("webhook payload must be a JSON object or array, got %s", jsonType(v))
	case "email":
		return checkEmail(v)
	case "slack":
		return checkSlack(v)
	case "payment":
		return checkPayment(v)
	}
	return invalid("unknown connector kind %q", kind)
}

// knownFields refuses a field the connector of kind does not know. The connectors decode
// payloads into structs, refusing unknown fields, but encoding/json matches names without
// regard to case (Unicode folding: "paramſ" is "params") and the last match wins: a
// field that differs from a known one only in case would replace, at delivery, the value
// checked here and shown to an approver.
func knownFields(kind string, obj map[string]any, fields ...string) error {
	for name := range obj {
		if !slices.Contains(fields, name) {
			return invalid("%s payload has the unknown field %q; its fields are %s", kind, name, strings.Join(fields, ", "))
		}
	}
	return nil
}

func checkEmail(v any) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return invalid("email payload must be a JSON object, got %s", jsonType(v))
	}
	if err := knownFields("email", obj, "to", "cc", "bcc", "reply_to", "subject", "text", "html", "headers"); err != nil {
		return err
	}
	to, err := addressList(obj, "to")
	if err != nil {
		return err
	}
	if len(to) == 0 {
		return invalid(`email payload needs "to": one or more addresses`)
	}
	for _, field := range []string{"cc", "bcc", "reply_to"} {
		if _, err := addressList(obj, field); err != nil {
			return err
		}
	}
	if s, _ := obj["subject"].(string); strings.TrimSpace(s) == "" {
		return invalid(`email payload needs a non-empty "subject" string`)
	} else if !connectors.ValidHeaderValue(s) {
		// The Resend transport refuses it (Resend makes a header line of it as given),
		// so every email instance does here: one kind, one rule.
		return invalid(`email "subject" must be one line, without control characters`)
	}
	if err := stringFields("email", obj, "text", "html"); err != nil {
		return err
	}
	if !nonEmptyString(obj["text"]) && !nonEmptyString(obj["html"]) {
		return invalid(`email payload needs "text" or "html" (a non-empty string)`)
	}
	if h, ok := obj["headers"]; ok {
		hm, ok := h.(map[string]any)
		if !ok {
			return invalid(`email "headers" must be an object of strings`)
		}
		seen := make(map[string]string, len(hm))
		for name, value := range hm {
			if s, ok := value.(string); !ok || !connectors.ValidHeaderValue(s) || !connectors.ValidMailHeaderName(name) {
				return invalid("email header %q must be a one-line string without control characters, its name printable ASCII without ':'", name)
			}
			if connectors.ReservedMailHeader(textproto.CanonicalMIMEHeaderKey(name)) {
				return invalid("email header %q is set by the connector and cannot be overridden", name)
			}
			// Header names are case-insensitive: two that differ only in case name one
			// header, and the connector cannot send both.
			if other, dup := seen[strings.ToLower(name)]; dup {
				return invalid("email headers %q and %q differ only in case, so they name one header; keep one", min(name, other), max(name, other))
			}
			seen[strings.ToLower(name)] = name
		}
	}
	return nil
}

// addressList reads obj[field] as one address string or a list of them, each of which
// must parse as an RFC 5322 address.
func addressList(obj map[string]any, field string) ([]string, error) {
	raw, ok := obj[field]
	if !ok {
		return nil, nil
	}
	var list []string
	switch r := raw.(type) {
	case string:
		list = []string{r}
	case []any:
		for _, e := range r {
			s, ok := e.(string)
			if !ok {
				return nil, invalid("email %q must hold address strings, got %s", field, jsonType(e))
			}
			list = append(list, s)
		}
	default:
		return nil, invalid("email %q must be an address or a list of addresses, got %s", field, jsonType(raw))
	}
	for _, a := range list {
		if _, err := mail.ParseAddress(a); err != nil {
			return nil, invalid("email %q address %q does not parse: %v", field, a, err)
		}
		if !connectors.ValidHeaderValue(a) { // net/mail takes a line break in a comment
			return nil, invalid("email %q address %q has control characters, which an address header cannot hold", field, a)
		}
	}
	return list, nil
}

func checkSlack(v any) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return invalid("slack payload must be a JSON object, got %s", jsonType(v))
	}
	if err := knownFields("slack", obj, "channel", "text", "blocks", "thread_ts"); err != nil {
		return err
	}
	if err := stringFields("slack", obj, "text"); err != nil {
		return err
	}
	if !nonEmptyString(obj["channel"]) {
		return invalid(`slack payload needs a non-empty "channel" string (a channel id such as C0123456789)`)
	}
	if ch := obj["channel"].(string); !connectors.IsSlackConversationID(ch) {
		return invalid(`slack "channel" %q is not a conversation ID (C…, G… or D…); the connector needs one to look a retry up`, ch)
	}
	blocks, hasBlocks := obj["blocks"]
	if hasBlocks {
		if b, ok := blocks.([]any); !ok || len(b) == 0 {
			return invalid(`slack "blocks" must be a non-empty array`)
		}
	}
	if !nonEmptyString(obj["text"]) && !hasBlocks {
		return invalid(`slack payload needs "text" (a non-empty string) or "blocks"`)
	}
	if ts, ok := obj["thread_ts"]; ok && !nonEmptyString(ts) {
		return invalid(`slack "thread_ts" must be a non-empty string`)
	} else if ok && !connectors.IsSlackMessageTS(ts.(string)) {
		// What the Slack connector refuses (see connectors.IsSlackMessageTS), for programs
		// that do not load its own check.
		return invalid(`slack "thread_ts" %q is not a message ts as Slack writes them (ten digits, a dot, six digits, such as "1700000000.000100")`, ts)
	}
	return nil
}

func checkPayment(v any) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return invalid("payment payload must be a JSON object, got %s", jsonType(v))
	}
	if err := knownFields("payment", obj, "operation", "params"); err != nil {
		return err
	}
	op, _ := obj["operation"].(string)
	known := false
	for _, o := range PaymentOperations {
		known = known || o == op
	}
	if !known {
		return invalid(`payment "operation" %q is not one of %s`, op, strings.Join(PaymentOperations, ", "))
	}
	if _, ok := obj["params"].(map[string]any); !ok {
		return invalid(`payment payload needs a "params" object`)
	}
	return nil
}

// stringFields refuses a field of obj that is neither a string nor null: the connector
// decodes it into a string, and would refuse the row on its first attempt.
func stringFields(kind string, obj map[string]any, fields ...string) error {
	for _, name := range fields {
		switch v := obj[name].(type) {
		case string, nil:
		default:
			return invalid("%s %q must be a string, got %s", kind, name, jsonType(v))
		}
	}
	return nil
}

func nonEmptyString(v any) bool {
	s, ok := v.(string)
	return ok && strings.TrimSpace(s) != ""
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// jsonbCounts names the first array of more than jsonbMaxElems elements, or object of
// more than jsonbMaxMembers members, in the JSON text raw, or returns "". It counts in
// the text, as jsonb_in does (an object's members before duplicate names are dropped,
// which decoding does), and before the text is decoded: 32 MiB of zeros in one array
// took seconds and a gigabyte of memory to decode. Only valid JSON's answer means
// anything.
func jsonbCounts(raw []byte) string {
	var commas []int // the open containers' commas so far, innermost last
	var kinds []byte
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			commas, kinds = append(commas, 0), append(kinds, c)
		case ']', '}':
			if len(commas) > 0 {
				commas, kinds = commas[:len(commas)-1], kinds[:len(kinds)-1]
			}
		case ',':
			if len(commas) == 0 {
				continue
			}
			top := len(commas) - 1
			commas[top]++ // a comma more, an element or a member more
			if kinds[top] == '[' && commas[top] >= jsonbMaxElems {
				return fmt.Sprintf("an array of more than %d elements", jsonbMaxElems)
			}
			if kinds[top] == '{' && commas[top] >= jsonbMaxMembers {
				return fmt.Sprintf("an object of more than %d members (duplicate names included)", jsonbMaxMembers)
			}
		}
	}
	return ""
}

// jsonbRefuses names the first thing in valid JSON text that PostgreSQL's jsonb refuses,
// or returns "": the escape \u0000, and a \u escape of half a surrogate pair without
// its other half. (Backslashes occur only inside strings in valid JSON.) Caught here,
// they are one clear error that leaves the caller's transaction usable, instead of an
// INSERT that fails and aborts it.
func jsonbRefuses(raw []byte) string {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		n, err := strconv.ParseUint(string(b[:4]), 16, 32)
		return rune(n), err == nil
	}
	if !utf8.Valid(raw) {
		return "bytes that are not UTF-8"
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // an escaped character, perhaps a backslash
			continue
		}
		r, ok := hex4(raw[i+2:])
		switch {
		case !ok:
			return ""
		case r == 0:
			return `the escape \u0000`
		case utf16.IsSurrogate(r):
			var low rune // the escape after it, which must complete the pair
			if i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
				low, _ = hex4(raw[i+8:])
			}
			if utf16.DecodeRune(r, low) == utf8.RuneError {
				return "half a surrogate pair (a \\u escape without its other half)"
			}
			i += 11
		default:
			i += 5
		}
	}
	return ""
}
