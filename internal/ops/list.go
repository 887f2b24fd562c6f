package ops

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
)

// Filter selects intents for [List] and, inside a [Selection], for [Replay]. Zero
// fields select everything.
type Filter struct {
	// Status keeps rows in any of these statuses; each must be one of [Statuses].
	Status []string `json:"status,omitempty"`
	// Connector keeps rows of this connector instance ("webhook", "webhook:crm").
	Connector string `json:"connector,omitempty"`
	// Connectors, when not empty, keeps rows of these connector instances; an entry
	// "kind:*" keeps every instance of the kind, the plain "kind" included. An API
	// token's scope narrows a listing with it.
	Connectors []string `json:"connectors,omitempty"`
	// KeyPrefix keeps rows whose idempotency key starts with it (compared literally:
	// '%' and '_' are not wildcards).
	KeyPrefix string `json:"key_prefix,omitempty"`
	// OlderThan keeps rows created more than this long before Now.
	OlderThan time.Duration `json:"older_than,omitempty"`
	// NewerThan keeps rows created less than this long before Now.
	NewerThan time.Duration `json:"newer_than,omitempty"`
	// ErrorContains keeps rows whose last error contains it, ignoring case.
	ErrorContains string `json:"error_contains,omitempty"`
	// OrderingKey keeps rows with this ordering key.
	OrderingKey string `json:"ordering_key,omitempty"`
	// Limit is the page size of [List]. Defaults to 50; at most 1000 (and a page of
	// large rows holds fewer: see maxPageBytes; follow its Next). In a [Selection]
	// it caps how many rows are selected, and zero means no cap.
	Limit int `json:"limit,omitempty"`
	// After is the cursor of the page to read: the Next of the previous [Page]. Empty
	// starts at the newest row.
	After string `json:"after,omitempty"`
	// Now is the clock OlderThan and NewerThan count from. Defaults to the database's
	// current time, on which rows are created (see dbNowOr).
	Now time.Time `json:"now,omitzero"`
}

// Page is one page of [List]: intents newest first, and the cursor of the next page.
type Page struct {
	Intents []outbox.Intent `json:"intents"`
	// Next is the cursor to pass as [Filter].After for the next page; empty at the end.
	Next string `json:"next,omitempty"`
}

// cursor is the position after which a page starts: the last row of the previous page.
// It travels base64url-encoded, and callers treat it as opaque. Inf is the created_at's
// infinity modifier when plain SQL wrote ±infinity, which CreatedAt cannot hold: a
// cursor at a stand-in time would start the next page before or after that row again.
// CreatedAt goes as seconds since 1970 and Micros, not as a JSON time, which stops at
// year 9999 where PostgreSQL goes on to 294276: the cursor of such a row did not encode,
// and paging ended there without a word. (Microseconds since 1970 would overflow an
// int64 in PostgreSQL's last years.) ID may be any bigint, zero and negative ones
// included: plain SQL may write any id, and a cursor refused for such a row ended
// paging there with a refusal of the cursor List had handed out.
type cursor struct {
	CreatedAt *int64                  `json:"s"`
	Micros    int64                   `json:"us,omitempty"`
	Inf       pgtype.InfinityModifier `json:"x,omitempty"`
	ID        *int64                  `json:"i"`
}

func (c cursor) encode() string {
	b, _ := json.Marshal(c) // ints always encode
	return base64.RawURLEncoding.EncodeToString(b)
}

// pgFirstSecond and pgEndSecond bound the seconds of a cursor's CreatedAt: PostgreSQL's
// years, 4714-11-24 BC to the end of 294276 AD. A time past them would reach the query
// as "timestamp out of range", an internal error, not a bad cursor.
const (
	pgFirstSecond = -210866803200 // 4714-11-24 00:00:00 BC UTC
	pgEndSecond   = 9224318016000 // 294277-01-01 00:00:00 UTC
)

func decodeCursor(s string) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	var c cursor
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.CreatedAt == nil || *c.CreatedAt < pgFirstSecond || *c.CreatedAt >= pgEndSecond ||
		c.Micros < 0 || c.Micros >= 1e6 || c.ID == nil || c.Inf < pgtype.NegativeInfinity || c.Inf > pgtype.Infinity {
		return nil, fmt.Errorf("%w: After: %q is not a cursor from a previous page", ErrInvalidFilter, s)
	}
	return &c, nil
}

// listSQL reads one page of rows matching a filter, newest first, with keyset
// pagination on (created_at, id). Every condition is a parameter that, when empty,
// disables itself, so the text never depends on user input:
// $1 statuses, $2 connector, $3 key prefix, $4 created before, $5 created after,
// $6 error substring, $7 ordering key, $8/$9 the cursor, $10 connector instances or
// "kind:*" patterns, $11 the page size.
// The key prefix uses starts_with, which has no wildcards to escape. created_at comes
// again at the end, as it is, for the cursor.
// One status is compared with =, not = ANY: outbox_needs_attention then hands over the
// rows of a dead, held or awaiting-approval listing newest first and the scan stops at
// the page's end; through = ANY, PostgreSQL before 17 does not take the index's order
// for the query's, and read every row of the status and sorted them, for every page
// (4,000 index rows and 4,000 buffers for the first 50 of 4,000 dead rows on 2 million;
// with =, 51 rows and 53 buffers). Several statuses still read all their rows.
const listSQL = `
SELECT ` + outbox.IntentColumns + `, created_at
FROM outbox
WHERE (cardinality($1::text[]) = 0
       OR (cardinality($1::text[]) = 1 AND status = ($1::text[])[1])
       OR (cardinality($1::text[]) > 1 AND status = ANY($1::text[])))
  AND ($2::text = '' OR connector = $2::text)
  AND ($3::text = '' OR starts_with(idempotency_key, $3::text))
  AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz)
  AND ($5::timestamptz IS NULL OR created_at > $5::timestamptz)
  AND ($6::text = '' OR strpos(lower(last_error), lower($6::text)) > 0)
  AND ($7::text = '' OR ordering_key = $7::text)
  AND ($8::timestamptz IS NULL OR (created_at, id) < ($8::timestamptz, $9::bigint))
  AND (cardinality($10::text[]) = 0 OR connector = ANY($10::text[])
       OR split_part(connector, ':', 1) || ':*' = ANY($10::text[]))
ORDER BY created_at DESC, id DESC
LIMIT $11`

// listArgs validates f and returns listSQL's arguments $1 to $10.
func (f Filter) listArgs() ([]any, error) {
	for _, s := range f.Status {
		if !knownStatus(s) {
			return nil, fmt.Errorf("%w: Status: unknown status %q (known: %v)", ErrInvalidFilter, s, Statuses)
		}
	}
	if f.OlderThan < 0 {
		return nil, fmt.Errorf("%w: OlderThan: %s is negative", ErrInvalidFilter, f.OlderThan)
	}
	if f.NewerThan < 0 {
		return nil, fmt.Errorf("%w: NewerThan: %s is negative", ErrInvalidFilter, f.NewerThan)
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("%w: Limit: %d is negative", ErrInvalidFilter, f.Limit)
	}
	c, err := decodeCursor(f.After)
	if err != nil {
		return nil, err
	}
	now := nowOr(f.Now)
	var before, after *time.Time
	var cursorAt *pgtype.Timestamptz
	var cursorID int64
	if f.OlderThan > 0 {
		t := now.Add(-f.OlderThan)
		before = &t
	}
	if f.NewerThan > 0 {
		t := now.Add(-f.NewerThan)
		after = &t
	}
	if c != nil {
		cursorAt = &pgtype.Timestamptz{Time: time.Unix(*c.CreatedAt, c.Micros*1000), InfinityModifier: c.Inf, Valid: true}
		cursorID = *c.ID
	}
	statuses := f.Status
	if statuses == nil {
		statuses = []string{}
	}
	connectors := f.Connectors
	if connectors == nil {
		connectors = []string{}
	}
	return []any{statuses, f.Connector, f.KeyPrefix, before, after, f.ErrorContains, f.OrderingKey,
		cursorAt, cursorID, connectors}, nil
}

// List returns one page of intents matching f, newest first (created_at, then id,
// descending). Pages are keyset-paginated: pass the returned Next as f.After for the
// following page; rows inserted meanwhile never shift a page or repeat a row.
// A filter with an unknown status, a negative duration or a bad cursor is refused with
// an error wrapping [ErrInvalidFilter].
func List(ctx context.Context, db outbox.DB, f Filter) (Page, error) {
	if f.OlderThan > 0 || f.NewerThan > 0 {
		now, err := dbNowOr(ctx, db, f.Now)
		if err != nil {
			return Page{}, fmt.Errorf("list: %w", err)
		}
		f.Now = now
	}
	args, err := f.listArgs()
	if err != nil {
		return Page{}, err
	}
	limit := min(cmp.Or(f.Limit, defaultListLimit), MaxListLimit)
	// One row more than the page says whether there is a next page.
	rows, err := db.Query(ctx, listSQL, append(args, limit+1)...)
	if err != nil {
		return Page{}, fmt.Errorf("list: %w", err)
	}
	defer rows.Close()
	var (
		page   Page
		lastAt pgtype.Timestamptz
		size   int
		more   bool
	)
	for rows.Next() {
		var at pgtype.Timestamptz
		in, err := outbox.ScanIntent(rows, &at)
		if err != nil {
			return Page{}, fmt.Errorf("list: %w", err)
		}
		// A row past the page, or one that would take the page past maxPageBytes, says
		// there is a next page, and starts it.
		rowSize := len(in.Payload) + len(in.Result) + len(in.LastError)
		for name, value := range in.Headers {
			// Plain SQL writes headers of any size too, and the page answers them.
			rowSize += len(name) + len(value)
		}
		if len(page.Intents) == limit || (len(page.Intents) > 0 && size+rowSize > maxPageBytes) {
			more = true
			break
		}
		page.Intents = append(page.Intents, in)
		size += rowSize
		lastAt = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("list: %w", err)
	}
	if page.Intents == nil {
		page.Intents = []outbox.Intent{}
	}
	if more {
		secs, id := lastAt.Time.Unix(), page.Intents[len(page.Intents)-1].ID
		page.Next = cursor{CreatedAt: &secs, Micros: int64(lastAt.Time.Nanosecond() / 1000), Inf: lastAt.InfinityModifier,
			ID: &id}.encode()
	}
	return page, nil
}

// maxPageBytes bounds the payloads, results, errors and headers one page of [List] holds: rows
// may be large (plain SQL writes any size), and a page of 1,000 rows of a megabyte each,
// held and encoded at once for an API token's GET, would take the server's memory. A
// page then has fewer rows than its limit, and its Next goes on; it always has one row.
const maxPageBytes = 8 << 20
