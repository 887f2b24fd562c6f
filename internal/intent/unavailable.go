package intent

import (
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err is the database being out of reach rather than a fault
// of the request: no connection could be made, or PostgreSQL ended the session the call
// had because it is shutting down (57P01 admin_shutdown, which a restart sends to every
// session), crashed (57P02) or is starting up (57P03). The pool drops such a session, and
// the same call made again, with its key, is safe whatever became of this one. A
// database that takes no writes (25006 read_only_sql_transaction: a hot standby the pool
// reached after a failover, a demoted primary, default_transaction_read_only) is
// unavailable too: the write did not happen, and the same call works once writes do.
// So is a session lost on the way, which ends the call with an EOF or a reset rather
// than a word from PostgreSQL: a pooler or a proxy that restarted, a failover that
// resets the connections (HAProxy's shutdown-sessions), a host gone; in the simple
// protocol (default_query_exec_mode=simple_protocol, behind a transaction pooler) pgx
// reports that loss as "conn closed" ([pgconn.ErrConnClosed]) instead. A timeout is not
// one: it is the caller's bound, which says so itself.
func Unavailable(err error) bool {
	if errors.As(err, new(*pgconn.ConnectError)) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	if opErr := (*net.OpError)(nil); errors.As(err, &opErr) && !opErr.Timeout() {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P03", "25006":
		return true
	}
	return false
}

// NothingWritten reports whether err, which [Unavailable] counts, shows that the call
// wrote nothing: no connection could be made, the server takes no writes (25006), or the
// session was lost before any of the call was sent. A session ended or lost while the
// call ran may have committed its write, and lost only the answer. "conn closed" is not
// taken as nothing sent, though pgx calls it safe to retry: in the simple protocol it is
// what a statement gets whose session was lost after it went out.
func NothingWritten(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, new(*pgconn.ConnectError)) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)) ||
		(errors.As(err, &pgErr) && pgErr.Code == "25006")
}

// Contended reports whether err is PostgreSQL ending the call's transaction to resolve a
// conflict with concurrent work: a serialization failure (40001: under a default
// isolation of REPEATABLE READ or SERIALIZABLE, a row that another transaction changed
// meanwhile, such as two decisions on one intent at once) or a deadlock (40P01). outbox
// retries them itself only in a transaction of its own, and a few times; the operators'
// decisions not at all. Like [Unavailable], it is no fault of the request: the
// transaction wrote nothing, and the same call made again, with its key, is safe and
// may well succeed.
func Contended(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") // serialization_failure, deadlock_detected
}

// leaveReadOnly closes the pool's sessions (those in use when they are released), through
// ResetFunc when it is set, when err is a write refused because the server takes none
// (25006), and returns err. After a failover that left the old primary up, new sessions
// may reach the new primary (target_session_attrs=read-write, a DNS name or a proxy that
// moved) while the pool's sessions on the old one answer pings, so pgxpool would keep
// them, and refuse every write, until its MaxConnLifetime (an hour by default).
func (s *Service) leaveReadOnly(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" {
		if s.ResetFunc != nil {
			s.ResetFunc()
		} else {
			s.Pool.Reset()
		}
	}
	return err
}
