package intent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// ErrConflictState means a decision cannot apply to the intent's current status, such as
// approving a rejected or canceled intent. It is [ops.ErrConflictState].
var ErrConflictState = ops.ErrConflictState

// CreateRequest is the body of a create: everything but the key, which travels apart
// (the Idempotency-Key header, or an MCP tool argument).
type CreateRequest struct {
	// Connector is the connector instance, such as "webhook" or "webhook:crm".
	Connector string `json:"connector"`
	// Payload is what the connector needs, as JSON.
	Payload json.RawMessage `json:"payload"`
	// OrderingKey, when set, delivers intents sharing it one at a time in order.
	OrderingKey string `json:"ordering_key,omitempty"`
	// NotBefore delays the first attempt.
	NotBefore *time.Time `json:"not_before,omitempty"`
}

// Service does what a token asks, within what [Policy] lets it.
type Service struct {
	// Pool is the database.
	Pool *pgxpool.Pool
	// Policy holds the tokens and the connectors that need approval.
	Policy *Policy
	// NowFunc is the clock of audit rows. Defaults to the database's clock, on which
	// relays and operators' commands write every other time of a row.
	NowFunc func() time.Time
	// ResetFunc closes the pool's sessions after a write met a server that takes no
	// writes (see leaveReadOnly). Defaults to Pool.Reset. A relay sharing the pool must
	// hear of it (outboxd serve sets the relay's ResetPool): this reset moves the pool to
	// the new primary before any claim of the relay's is refused, and the relay's LISTEN
	// connection, made outside the pool, would stay on the old server.
	ResetFunc func()
}

// now is NowFunc's time, or zero for the database's clock (see [ops.Approve]).
func (s *Service) now() time.Time {
	if s.NowFunc != nil {
		return s.NowFunc()
	}
	return time.Time{}
}

// Create enqueues an intent under key for tok through [outbox.Enqueue], so validation
// and idempotency are those of every other caller: the same request under a known key
// returns the existing intent with Inserted false; a different one fails with an error
// wrapping [outbox.ErrKeyConflict]; an invalid one with [outbox.ErrInvalidMessage]. A
// connector the token may not use fails with [ErrForbidden]. Intents of connectors in
// [Policy.ApprovalRequired] start awaiting_approval; created_by is the token's name.
func (s *Service) Create(ctx context.Context, tok *Token, key string, req CreateRequest) (outbox.Intent, error) {
	return s.create(ctx, tok, key, req, false)
}

// ErrPathlessKey marks a new intent [Service.Propose] refused because no URL path can
// name its key.
var ErrPathlessKey = errors.New("the key cannot be named in a URL path")

// pathless says key cannot be named in a URL path: a path cleans /v1/intents/.. away, so
// an intent under it could never be read or decided through the intent API.
func pathless(key string) bool { return key == "." || key == ".." }

// Propose is [Service.Create] for the faces agents and services propose through (the
// intent API, MCP): no new intent is taken under a key no URL path can name ("." or ".."),
// which approvers and clients of the API could never read or decide; that fails with an
// error wrapping [ErrPathlessKey], writing nothing. One written under such a key before
// the rule (by an older outboxd, or plain SQL) is still the answer to its request, as
// [Service.Existing] gives it: a client told to use another key for it would act again.
func (s *Service) Propose(ctx context.Context, tok *Token, key string, req CreateRequest) (outbox.Intent, error) {
	if !pathless(key) {
		return s.Create(ctx, tok, key, req)
	}
	in, err := s.Existing(ctx, tok, key, req)
	if errors.Is(err, outbox.ErrNotFound) {
		return outbox.Intent{}, fmt.Errorf("%w: %q", ErrPathlessKey, key)
	}
	return in, err
}

// Existing is [Service.Create] that writes nothing: it answers req under key as Create
// answers the same request again, with the intent key holds, or with Create's refusals;
// when no intent holds key, it fails with an error wrapping [outbox.ErrNotFound]. A face
// that cannot take a new intent under some key (the intent API, one whose key no URL path
// can name) still answers the request of an intent written under it before.
func (s *Service) Existing(ctx context.Context, tok *Token, key string, req CreateRequest) (outbox.Intent, error) {
	return s.create(ctx, tok, key, req, true)
}

// errInserted rolls back an enqueue that was to write nothing but inserted a row.
var errInserted = errors.New("inserted")

// enqueue enqueues m as outbox.Enqueue does; with existing set it writes nothing, and
// reports ok false when m's key holds no intent (the row enqueued is rolled back).
func (s *Service) enqueue(ctx context.Context, m outbox.Message, existing bool) (in outbox.Intent, ok bool, err error) {
	if !existing {
		in, err = outbox.Enqueue(ctx, s.Pool, m)
		return in, err == nil, err
	}
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		if in, err = outbox.Enqueue(ctx, tx, m); err == nil && in.Inserted {
			return errInserted // the key holds no intent: roll back
		}
		return err
	})
	if errors.Is(err, errInserted) {
		return outbox.Intent{}, false, nil
	}
	return in, err == nil, err
}

func (s *Service) create(ctx context.Context, tok *Token, key string, req CreateRequest, existing bool) (outbox.Intent, error) {
	// A name that is no connector instance at all is the request's fault, whatever the
	// token's scope: checked first, so it is not reported as a connector the token may
	// not use.
	if !outbox.ValidConnectorName(req.Connector) || !slices.Contains(outbox.Kinds, outbox.ConnectorKind(req.Connector)) {
		return outbox.Intent{}, fmt.Errorf("%w: connector %q is not a connector instance: name a kind (%s), or kind:name with lowercase letters, digits and '_'",
			outbox.ErrInvalidMessage, req.Connector, strings.Join(outbox.Kinds, ", "))
	}
	if !tok.Allows(req.Connector) {
		return outbox.Intent{}, fmt.Errorf("%w: token %q may not use connector %q", ErrForbidden, tok.Name, req.Connector)
	}
	m := outbox.Message{
		Key:             key,
		Connector:       req.Connector,
		RequireApproval: s.Policy.requiresApproval(req.Connector),
		CreatedBy:       tok.Name,
	}
	if len(req.Payload) > 0 {
		m.Payload = req.Payload
	}
	if req.NotBefore != nil {
		m.NotBefore = *req.NotBefore
	}
	orderingKey, err := scopedOrderingKey(tok, req.OrderingKey)
	if err != nil {
		// Too long to keep within the token, but the token may have written this request
		// while it was allowed everything, with the key as given: the same request
		// retried is that intent, not an invalid one for the client to change.
		m.OrderingKey = orderingKeyPrefix(tok) + req.OrderingKey
		again, ok, lookErr := s.replayOtherScope(ctx, tok, m, req.OrderingKey)
		if lookErr != nil {
			return outbox.Intent{}, s.leaveReadOnly(lookErr)
		}
		if ok {
			return again, nil
		}
		return outbox.Intent{}, err
	}
	m.OrderingKey = orderingKey
	in, ok, err := s.enqueue(ctx, m, existing)
	if err == nil && !ok {
		return outbox.Intent{}, fmt.Errorf("%w: no intent has key %q", outbox.ErrNotFound, key)
	}
	if errors.Is(err, outbox.ErrKeyConflict) && req.OrderingKey != "" {
		again, ok, lookErr := s.replayOtherScope(ctx, tok, m, req.OrderingKey)
		if lookErr != nil {
			return outbox.Intent{}, s.leaveReadOnly(lookErr)
		}
		if ok {
			return again, nil
		}
	}
	if err != nil {
		return outbox.Intent{}, s.leaveReadOnly(err) // outbox's errors say what was refused
	}
	return in, nil
}

// replayOtherScope returns the intent m.Key names when tok wrote it with the same
// request but the ordering key's other form (key given as key): tok's connectors changed
// between "*" and a scope since, or the row predates scoped ordering keys. The same
// decision retried is then the same intent, not a conflict. Nothing is written.
//
// An error is one that says nothing about the row (the database lost, a timeout): the
// caller must answer it rather than the conflict or the invalid ordering key it had,
// which tell the client to change a request that may well be this intent's, and a
// client that takes a new key for it has the operation performed twice.
func (s *Service) replayOtherScope(ctx context.Context, tok *Token, m outbox.Message, key string) (outbox.Intent, bool, error) {
	prev, err := outbox.Get(ctx, s.Pool, m.Key)
	if errors.Is(err, outbox.ErrNotFound) {
		return outbox.Intent{}, false, nil // deleted meanwhile (retention)
	}
	if err != nil {
		return outbox.Intent{}, false, err
	}
	if prev.CreatedBy != tok.Name {
		return outbox.Intent{}, false, nil
	}
	alt := key
	if m.OrderingKey == key {
		alt = orderingKeyPrefix(tok) + key
	}
	if prev.OrderingKey != alt {
		return outbox.Intent{}, false, nil
	}
	m.OrderingKey = alt
	// Nothing written: the row went away meanwhile (inserted, rolled back), or is not this
	// request's after all.
	in, ok, err := s.enqueue(ctx, m, true)
	switch {
	case err == nil:
		return in, ok, nil
	case errors.Is(err, outbox.ErrKeyConflict), errors.Is(err, outbox.ErrInvalidMessage):
		return outbox.Intent{}, false, nil
	}
	return outbox.Intent{}, false, err
}

// scopedOrderingKey is the ordering key an intent of tok is stored with. Ordering keys are
// one namespace for every connector: a row holds back the later rows of its key, whatever
// their connector, while it is pending (not_before far ahead, say), held or awaiting
// approval. A token allowed every connector could write those rows anyway, and shares the
// application's keys; a token scoped to some connectors has its keys to itself, prefixed
// "token:<name>/", so it cannot hold back rows it may not write, read or cancel. A key
// that already begins with the token's prefix is kept as it is.
func scopedOrderingKey(tok *Token, key string) (string, error) {
	if key == "" || tok.all() {
		return key, nil
	}
	if strings.HasPrefix(key, orderingKeyPrefix(tok)) {
		// Already the token's own: the form its intents show, sent back (a client, or an
		// agent, naming the order of its next intent as it read it). Prefixed again it was
		// another ordering key, and the two intents were not ordered with each other.
		return key, nil
	}
	scoped := orderingKeyPrefix(tok) + key
	if n := utf8.RuneCountInString(scoped); n > outbox.MaxKeyLength {
		return "", fmt.Errorf("%w: the ordering key is kept within token %q as %q, %d characters, and the outbox holds at most %d",
			outbox.ErrInvalidMessage, tok.Name, scoped, n, outbox.MaxKeyLength)
	}
	return scoped, nil
}

// orderingKeyPrefix starts the ordering keys of a scoped tok: "token:<name>/", with "%"
// and "/" in the name escaped (%25, %2F), so that no token's prefix begins another's
// (tokens "team" and "team/b" would share "token:team/b/x").
func orderingKeyPrefix(tok *Token) string {
	return "token:" + nameEscaper.Replace(tok.Name) + "/"
}

var nameEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// Get returns the intent with key. An intent of a connector the token may not use is
// reported as not found (an error wrapping [outbox.ErrNotFound]), so its existence does
// not leak.
func (s *Service) Get(ctx context.Context, tok *Token, key string) (outbox.Intent, error) {
	in, err := outbox.Get(ctx, s.Pool, key)
	if err != nil {
		return outbox.Intent{}, err
	}
	if err := visible(tok, key)(in); err != nil {
		return outbox.Intent{}, err
	}
	return in, nil
}

// Copies says where the operation of an intent went once an operator re-executed it
// under a new key (outboxd replay --new-key): that makes a copy of the row, and leaves
// the row itself as it was, dead or held, so that its status alone reads as a failed
// operation. See [Service.CopiesOf].
type Copies struct {
	// CopyOf is the key of the intent this one is a copy of, when it is one.
	CopyOf string
	// ReplayedAs is the latest copy of the operation (of this intent, or of the one it
	// copies), when that is not this intent: where the operation went. Nil when there is
	// none.
	ReplayedAs *Copy
	// Unknown says the copies could not be looked up: the database role may not read
	// outbox_audit, which outboxd mcp's role need not (README).
	Unknown bool
}

// Copy is a copy that replay --new-key made, as [Copies] names it.
type Copy struct {
	Key string `json:"key"`
	// Status is the copy's status now; empty when Gone.
	Status string `json:"status,omitempty"`
	// Gone says the copy is no longer kept: it was delivered or canceled, then deleted
	// after OUTBOX_RETENTION (or by purge), which delete no other rows.
	Gone bool `json:"gone,omitempty"`
}

// CopiesOf returns, by key, the copies of each of ins' operations that tok may know
// of: only those of its connectors, as [Service.Get] reads intents. A copy keeps its row's connector, so a
// token that reads one reads the other; a row whose connector plain SQL changed since is
// left out, so its existence does not leak. A copy that is gone is named all the same:
// its key is in the audit trail of the intent's operation, whose connector tok may use.
//
// A role that may not read outbox_audit gets Copies{Unknown: true} for each, not an
// error: the intents themselves are what was asked for. Intents with no copy to name are
// left out. It asks the database three times at most, whatever the number of intents
// (a page of [Service.List]), rather than three times an intent.
func (s *Service) CopiesOf(ctx context.Context, tok *Token, ins []outbox.Intent) (map[string]Copies, error) {
	keys := make([]string, len(ins))
	for i, in := range ins {
		keys[i] = in.Key
	}
	unknown := func() map[string]Copies {
		out := make(map[string]Copies, len(keys))
		for _, k := range keys {
			out[k] = Copies{Unknown: true}
		}
		return out
	}
	originals, err := ops.CopiesOf(ctx, s.Pool, keys)
	if insufficientPrivilege(err) {
		return unknown(), nil
	}
	if err != nil {
		return nil, err
	}
	// op is the key of the row whose copies are each intent's operation: the row it
	// copies, when it is a copy tok may know the row of, or itself.
	op := make(map[string]string, len(keys))
	opKeys := make([]string, 0, len(keys))
	for _, k := range keys {
		op[k] = k
		if of, ok := originals[k]; ok && tok.Allows(of.Connector) {
			op[k] = of.Key
		}
		opKeys = append(opKeys, op[k])
	}
	latest, err := ops.LatestCopies(ctx, s.Pool, opKeys)
	if insufficientPrivilege(err) {
		return unknown(), nil
	}
	if err != nil {
		return nil, err
	}
	var copies []string
	for _, k := range keys {
		if l := latest[op[k]]; l != "" && l != k {
			copies = append(copies, l)
		}
	}
	status, err := ops.StatusOf(ctx, s.Pool, copies)
	if err != nil {
		return nil, err
	}
	out := map[string]Copies{}
	for _, k := range keys {
		var c Copies
		if op[k] != k {
			c.CopyOf = op[k]
		}
		if l := latest[op[k]]; l != "" && l != k {
			st, ok := status[l]
			switch {
			case !ok:
				c.ReplayedAs = &Copy{Key: l, Gone: true}
			case tok.Allows(st.Connector):
				c.ReplayedAs = &Copy{Key: l, Status: st.Status}
			}
		}
		if c.CopyOf != "" || c.ReplayedAs != nil {
			out[k] = c
		}
	}
	return out, nil
}

// MayHaveActed maps those of ins that are canceled or dead after an attempt that may have
// reached the receiver to why ([ops.EndedReached]), a canceled one as the cancel answered
// it: read later, "canceled" alone tells a client the operation never happened, and
// "dead" that it failed, when the receiver may have performed it. Only intents canceled
// or dead after an attempt are looked up, in one query. A role that may not read
// outbox_attempts, which outboxd mcp's role need not (README), gets each of those named
// all the same, with a reason that says whether one reached the receiver is unknown: not
// an error, the intent itself is what was asked for.
func (s *Service) MayHaveActed(ctx context.Context, ins []outbox.Intent) (map[string]ops.Reached, error) {
	var keys []string
	attempted := map[string]outbox.Intent{}
	for _, in := range ins {
		if (in.Status == outbox.StatusCanceled || in.Status == outbox.StatusDead) && in.Attempts > 0 {
			keys = append(keys, in.Key)
			attempted[in.Key] = in
		}
	}
	acted, err := ops.EndedReached(ctx, s.Pool, keys)
	if insufficientPrivilege(err) {
		acted = make(map[string]ops.Reached, len(keys))
		for k, in := range attempted {
			undo := "canceling stops further attempts but cannot undo what it did"
			if in.Status == outbox.StatusDead {
				undo = "the relay giving up on it does not undo what it did"
			}
			acted[k] = ops.Reached{Connector: in.Connector, Reason: fmt.Sprintf("%s after %d attempt(s); this server's database role "+
				"may not read the attempt log (SELECT on outbox_attempts), so whether one reached the receiver is unknown, "+
				"and it may have acted already: %s; outboxd inspect shows the attempts", in.Status, in.Attempts, undo)}
		}
		return acted, nil
	}
	return acted, err
}

// Notes is what became of intents' operations that their statuses alone do not say,
// by key: the copies an operator made to re-execute them under a new key
// ([Service.CopiesOf]), and why a canceled or dead one's receiver may have acted
// ([Service.MayHaveActed]). The intent API and MCP answer both with every intent they
// show.
type Notes struct {
	Copies map[string]Copies
	Acted  map[string]ops.Reached
}

// Notes looks up the [Notes] of ins as tok may read them, with as few queries for a
// page as for one intent.
func (s *Service) Notes(ctx context.Context, tok *Token, ins []outbox.Intent) (Notes, error) {
	copies, err := s.CopiesOf(ctx, tok, ins)
	if err != nil {
		return Notes{}, err
	}
	acted, err := s.MayHaveActed(ctx, ins)
	return Notes{Copies: copies, Acted: acted}, err
}

// Of returns the notes of the intent with key: its copies, and why its receiver may have
// acted (nil when there is nothing to say).
func (n Notes) Of(key string) (Copies, *ops.Reached) {
	r, ok := n.Acted[key]
	if !ok {
		return n.Copies[key], nil
	}
	return n.Copies[key], &r
}

// insufficientPrivilege says err is PostgreSQL's refusal of a table the role has no
// grant on.
func insufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501" // insufficient_privilege
}

// LimitError is the refusal of a list's page size, the limit the client sent as got
// (the API's query parameter, MCP's argument as JSON wrote it), that is no positive
// integer. A larger one than a page holds is not refused: it reads a full page, as
// [ops.List] caps it. Both faces refuse with it, so an agent hears the same rule from
// either.
func LimitError(got string) error {
	return fmt.Errorf("%w: limit must be a positive integer, got %s; a page holds at most %d intents, and a larger limit reads that many",
		ops.ErrInvalidFilter, got, ops.MaxListLimit)
}

// List returns one page of intents as [ops.List] does, narrowed to the connectors the
// token may use. Asking for a connector outside them fails with [ErrForbidden]; for a
// connector name no row can hold, with [ops.ErrInvalidFilter].
func (s *Service) List(ctx context.Context, tok *Token, f ops.Filter) (ops.Page, error) {
	if f.Connector != "" && !outbox.ValidConnectorName(f.Connector) {
		// No row can hold it, and PostgreSQL refuses text with NUL or bytes not UTF-8.
		return ops.Page{}, fmt.Errorf("%w: connector %q is not a connector instance: a kind such as webhook, or kind:name with lowercase letters, digits and '_'",
			ops.ErrInvalidFilter, f.Connector)
	}
	if f.Connector != "" && !tok.Allows(f.Connector) {
		return ops.Page{}, fmt.Errorf("%w: token %q may not use connector %q", ErrForbidden, tok.Name, f.Connector)
	}
	f.Connectors = nil
	if !tok.all() {
		f.Connectors = append([]string(nil), tok.Connectors...)
	}
	return ops.List(ctx, s.Pool, f)
}

// Approve moves an awaiting_approval intent to pending ([ops.Approve]); admin tokens
// only ([ErrForbidden]), and not the token that proposed it ([ErrForbidden] too): an
// approval gate is a second pair of eyes, and an agent given an admin token would
// otherwise approve its own payments. Another token, or an operator with `outboxd
// approve`, approves it. Approving twice returns the intent unchanged; approving a
// rejected or canceled one fails with [ErrConflictState].
func (s *Service) Approve(ctx context.Context, tok *Token, key, reason string) (outbox.Intent, error) {
	in, err := s.decidable(ctx, tok, key)
	if err != nil {
		return outbox.Intent{}, err
	}
	// Checked on the row read above, and again on the row as the approval locks it: the
	// key's row may have been replaced in between (a rejected intent deleted by retention
	// or purge, and proposed again by this token), and the approval would otherwise
	// approve a row this check never saw.
	check := func(in outbox.Intent) error {
		if err := visible(tok, key)(in); err != nil {
			return err
		}
		if in.Status == outbox.StatusAwaitingApproval && in.CreatedBy == tok.Name {
			return fmt.Errorf("%w: token %q proposed intent %q, so it cannot approve it too: "+
				"another admin token, or an operator with `outboxd approve`, approves it", ErrForbidden, tok.Name, key)
		}
		return nil
	}
	if err := check(in); err != nil {
		return outbox.Intent{}, err
	}
	in, err = ops.Decide(ctx, s.Pool, ops.ActionApprove, key, actor(tok), reason, s.now(), check)
	return in, s.leaveReadOnly(err)
}

// Reject cancels an awaiting_approval intent ([ops.Reject]); admin tokens only.
// Rejecting twice returns the intent unchanged; rejecting one past approval fails with
// [ErrConflictState].
func (s *Service) Reject(ctx context.Context, tok *Token, key, reason string) (outbox.Intent, error) {
	if err := s.admin(ctx, tok, key); err != nil {
		return outbox.Intent{}, err
	}
	// The token's scope again on the row as the rejection locks it (see Approve).
	in, err := ops.Decide(ctx, s.Pool, ops.ActionReject, key, actor(tok), reason, s.now(), visible(tok, key))
	return in, s.leaveReadOnly(err)
}

// visible checks that tok may see the intent with key, as Get does: one of another
// connector is not found.
func visible(tok *Token, key string) func(outbox.Intent) error {
	return func(in outbox.Intent) error {
		if !tok.Allows(in.Connector) {
			return fmt.Errorf("%w: no intent has key %q", outbox.ErrNotFound, key)
		}
		return nil
	}
}

// Cancel cancels an intent with [ops.Cancel]'s rules; admin tokens only. Canceling
// twice returns the intent unchanged; an intent Cancel refuses (in flight, delivered,
// dead) fails with [ErrConflictState] and the reason. acted is set when an attempt of
// the intent may have reached the receiver ([ops.CancelResult].MayHaveActed), which may
// have acted already: canceled all the same, it is not one that never happened.
func (s *Service) Cancel(ctx context.Context, tok *Token, key, reason string) (in outbox.Intent, acted *ops.Reached, err error) {
	if err := s.admin(ctx, tok, key); err != nil {
		return outbox.Intent{}, nil, err
	}
	// The scope again, on the row as locked: the one read above may have been replaced
	// under its key since (see ops.CancelWhere).
	res, err := ops.CancelWhere(ctx, s.Pool, []string{key}, actor(tok), reason, s.now(), tok.Allows)
	if err != nil {
		return outbox.Intent{}, nil, s.leaveReadOnly(err)
	}
	if len(res.NotFound) > 0 {
		return outbox.Intent{}, nil, fmt.Errorf("%w: no intent has key %q", outbox.ErrNotFound, key)
	}
	if why, ok := res.Refused[key]; ok {
		return outbox.Intent{}, nil, fmt.Errorf("%w: intent %q cannot be canceled: %s", ErrConflictState, key, why)
	}
	if r, ok := res.MayHaveActed[key]; ok {
		acted = &r
	}
	// As the token may see it: the row under key may have been replaced since the cancel.
	in, err = s.Get(ctx, tok, key)
	return in, acted, err
}

// admin checks that tok may decide about the intent with key: an admin token whose
// connectors include the intent's. An intent it may not see is not found.
func (s *Service) admin(ctx context.Context, tok *Token, key string) error {
	_, err := s.decidable(ctx, tok, key)
	return err
}

// decidable is admin, and returns the intent as it is now.
func (s *Service) decidable(ctx context.Context, tok *Token, key string) (outbox.Intent, error) {
	if tok == nil || !tok.Admin {
		name := ""
		if tok != nil {
			name = tok.Name
		}
		return outbox.Intent{}, fmt.Errorf("%w: token %q is not an admin token; only admins approve, reject and cancel", ErrForbidden, name)
	}
	return s.Get(ctx, tok, key)
}

// actor names a token in the audit trail.
func actor(tok *Token) string { return "token:" + tok.Name }
