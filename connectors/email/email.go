package email

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	gomail "github.com/wneessen/go-mail"
	"github.com/wneessen/go-mail/smtp"

	"github.com/outboxd/outboxd/connectors"
)

// TLS policies for [Config.TLS].
const (
	// TLSOpportunistic upgrades the connection with STARTTLS when the server offers it,
	// and sends in clear otherwise. When STARTTLS is offered, the certificate is verified.
	TLSOpportunistic = "opportunistic"
	// TLSMandatory refuses to send unless the server offers STARTTLS and the handshake
	// succeeds.
	TLSMandatory = "mandatory"
	// TLSNone never uses STARTTLS.
	TLSNone = "none"
	// TLSImplicit speaks TLS from the first byte, as SMTPS (port 465) does, and verifies
	// the certificate; there is no STARTTLS on such a port, whose server waits for a TLS
	// handshake and never greets a client that starts in clear.
	TLSImplicit = "implicit"
)

// Config configures a [Connector]. A zero field means its default.
type Config struct {
	// Addr is the SMTP server as host:port, such as "smtp.example.com:587". Required.
	Addr string
	// Username turns on SMTP AUTH when set; the mechanism is picked from those the
	// server offers (SCRAM, CRAM-MD5, then PLAIN or LOGIN, which go-mail only uses over
	// TLS or to a loopback server). Defaults to no authentication.
	Username string
	// Password goes with Username. It never appears in logs or errors.
	Password string
	// From is the sender: the From header and the envelope sender, such as
	// "Shop <orders@shop.example>". Its domain is also the right side of every
	// Message-ID. Required.
	From string
	// Timeout bounds one attempt, from dialling to the server's reply to the message.
	// Defaults to 30s.
	Timeout time.Duration
	// TLS is the STARTTLS policy: [TLSOpportunistic], [TLSMandatory] or [TLSNone]; or
	// [TLSImplicit] for a server that speaks TLS from the start (SMTPS, port 465).
	// Defaults to [TLSOpportunistic].
	TLS string
	// TLSConfig is used for STARTTLS and implicit TLS; it is cloned, and its ServerName defaults to the
	// host of Addr. Defaults to the system roots and TLS 1.2 or later.
	TLSConfig *tls.Config
	// NowFunc is the clock for the Date header. Defaults to time.Now.
	NowFunc func() time.Time
}

// String describes cfg without its password, so that printing a Config with %v or %+v
// cannot leak it.
func (cfg Config) String() string {
	return fmt.Sprintf("email.Config{Addr:%q Username:%q Password:%s From:%q Timeout:%s TLS:%q}",
		shownAddr(cfg.Addr), cfg.Username, redacted(cfg.Password), cfg.From, cfg.Timeout, cfg.TLS)
}

// GoString is String, for %#v.
func (cfg Config) GoString() string { return cfg.String() }

// LogValue keeps the password out of logs.
func (cfg Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", shownAddr(cfg.Addr)),
		slog.String("username", cfg.Username),
		slog.String("password", redacted(cfg.Password)),
		slog.String("from", cfg.From),
		slog.Duration("timeout", cfg.Timeout),
		slog.String("tls", cfg.TLS),
	)
}

// shownAddr is addr as messages and logs show it: what comes before an "@" may be a
// password (an address written as a URL with credentials, "smtp://user:pass@host:587",
// as other tools take it), which New refuses, and is never shown, as outboxd's
// configuration does not show it.
func shownAddr(addr string) string {
	if at := strings.LastIndexByte(addr, '@'); at >= 0 {
		return "xxxxx" + addr[at:]
	}
	return addr
}

func redacted(secret string) string {
	if secret == "" {
		return `""`
	}
	return "REDACTED"
}

const (
	defaultTimeout = 30 * time.Second
	// defaultIDDomain is the right side of Message-IDs when From's domain is not a plain
	// domain name (an address literal, say).
	defaultIDDomain = "outboxd"
)

// ErrTimeout is the cause of an attempt that ran past [Config.Timeout]; errors.Is finds
// it in the error Deliver returns.
var ErrTimeout = errors.New("email attempt timed out")

// Connector sends rows as email through one SMTP server. It is safe for concurrent use.
type Connector struct {
	addr      string // host:port
	host      string
	port      int
	username  string
	password  string
	from      *mail.Address
	idDomain  string
	timeout   time.Duration
	tlsPolicy gomail.TLSPolicy
	implicit  bool // TLS from the first byte (TLSImplicit)
	tlsName   string
	tlsConfig *tls.Config
	now       func() time.Time
	// secrets are the password as AUTH sends it (in base64, alone for LOGIN and with the
	// user name for PLAIN) and as written, longest first: a server's reply may quote them,
	// and none may reach an error (see Deliver).
	secrets []string
}

var _ connectors.Connector = (*Connector)(nil)

// New returns a connector for cfg, or an error naming each field that is wrong.
func New(cfg Config) (*Connector, error) {
	cfg = cfg.withDefaults()
	c := &Connector{
		username: cfg.Username,
		password: cfg.Password,
		timeout:  cfg.Timeout,
		tlsName:  cfg.TLS,
		now:      cfg.NowFunc,
	}
	var errs []error
	host, port, err := parseAddr(cfg.Addr)
	if err != nil {
		errs = append(errs, err)
	}
	c.addr, c.host, c.port = net.JoinHostPort(host, strconv.Itoa(port)), host, port
	if cfg.From == "" {
		errs = append(errs, errors.New("From: required"))
	} else if c.from, err = mail.ParseAddress(cfg.From); err != nil {
		errs = append(errs, fmt.Errorf("From: %q is not an email address: %w", cfg.From, err))
	} else {
		c.idDomain = idDomain(c.from.Address)
	}
	if cfg.Password != "" && cfg.Username == "" {
		errs = append(errs, errors.New("Password: set without Username"))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: %s is negative", cfg.Timeout))
	}
	switch cfg.TLS {
	case TLSOpportunistic:
		c.tlsPolicy = gomail.TLSOpportunistic
	case TLSMandatory:
		c.tlsPolicy = gomail.TLSMandatory
	case TLSNone:
		c.tlsPolicy = gomail.NoTLS
	case TLSImplicit:
		// The connection is TLS already (see dial): no STARTTLS on top.
		c.tlsPolicy, c.implicit = gomail.NoTLS, true
	default:
		errs = append(errs, fmt.Errorf("TLS: %q is not opportunistic, mandatory, none or implicit", cfg.TLS))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("email config: %w", err) // one line per problem, each complete
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	if cfg.TLSConfig != nil {
		c.tlsConfig = cfg.TLSConfig.Clone()
	} else {
		c.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.tlsConfig.ServerName == "" {
		c.tlsConfig.ServerName = host
	}
	if c.password != "" {
		b64 := base64.StdEncoding.EncodeToString
		c.secrets = []string{b64([]byte("\x00" + c.username + "\x00" + c.password)), b64([]byte(c.password)), c.password}
	}
	return c, nil
}

func (cfg Config) withDefaults() Config {
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.TLS = cmp.Or(cfg.TLS, TLSOpportunistic)
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	return cfg
}

func parseAddr(addr string) (string, int, error) {
	if addr == "" {
		return "", 0, errors.New("Addr: required")
	}
	shown := shownAddr(addr)
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("Addr: %q is not host:port", shown)
	}
	if host == "" {
		return "", 0, fmt.Errorf("Addr: %q has no host", shown)
	}
	if !connectors.DialableHost(host) {
		// A space from an env file, say: every attempt would fail to look it up.
		return "", 0, fmt.Errorf("Addr: %q is not a host name or IP address", shownAddr(host))
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("Addr: %q has no valid port (1-65535)", shown)
	}
	return host, port, nil
}

// idDomain returns the domain of addr when it is a plain domain name, which is what the
// right side of a Message-ID should be; otherwise defaultIDDomain.
func idDomain(addr string) string {
	_, domain, ok := strings.Cut(addr, "@")
	domain = strings.ToLower(domain)
	if !ok || domain == "" || domain[0] == '.' || domain[len(domain)-1] == '.' || strings.Contains(domain, "..") {
		return defaultIDDomain
	}
	for i := 0; i < len(domain); i++ {
		ch := domain[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.') {
			return defaultIDDomain
		}
	}
	return domain
}

// MessageID returns the Message-ID, angle brackets included, that a connector sending
// from domain gives the row with key: the first 32 hex digits of SHA-256(key), "@" and
// the domain. It is the same on every attempt, so a receiver that dedupes on Message-ID
// keeps one copy.
func MessageID(key, domain string) string {
	sum := sha256.Sum256([]byte(key))
	return "<" + hex.EncodeToString(sum[:])[:32] + "@" + domain + ">"
}

// String names the connector by its server and sender, and never shows the password.
func (c *Connector) String() string { return "email smtp://" + c.addr + " from " + c.from.Address }

// GoString is String, for %#v, which would otherwise print the fields, password included.
func (c *Connector) GoString() string { return c.String() }

// LogValue keeps the password out of logs.
func (c *Connector) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.addr),
		slog.String("username", c.username),
		slog.String("password", redacted(c.password)),
		slog.String("from", c.from.Address),
		slog.String("tls", c.tlsName),
	)
}

// Guarantee reports [connectors.Forwarded]: the key travels as Message-ID and
// Idempotency-Key, but SMTP servers are not known to dedupe on either.
func (c *Connector) Guarantee() connectors.Guarantee { return connectors.Forwarded }

// Timeout is the time limit of one attempt (see [connectors.Timeouter]).
func (c *Connector) Timeout() time.Duration { return c.timeout }

// Payload is what a row's payload holds for this connector.
type Payload struct {
	To      Addresses         `json:"to"`
	Cc      Addresses         `json:"cc,omitempty"`
	Bcc     Addresses         `json:"bcc,omitempty"`
	ReplyTo Addresses         `json:"reply_to,omitempty"`
	Subject string            `json:"subject,omitempty"`
	Text    string            `json:"text,omitempty"`
	HTML    string            `json:"html,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Addresses is one address or a list of them: in JSON, "a@x" or ["a@x", "B <b@x>"].
type Addresses []string

// UnmarshalJSON accepts a string or an array of strings.
func (a *Addresses) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = Addresses{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("an address must be a string or an array of strings")
	}
	*a = many
	return nil
}

// Result is what Deliver returns for the relay to store after a success.
type Result struct {
	// MessageID is the Message-ID header sent, angle brackets included.
	MessageID string `json:"message_id"`
	// Accepted are the envelope recipients the server accepted (To, Cc and Bcc).
	Accepted []string `json:"accepted"`
	// ServerReply is the server's reply to the message, such as "250 2.0.0 queued as X".
	ServerReply string `json:"server_reply,omitempty"`
}

// message is a payload checked and built for sending.
type message struct {
	msg       *gomail.Msg
	messageID string
	rcpts     []string // envelope recipients, bare addresses
}

// Deliver sends the row as one email, over a new connection. See the package
// documentation for the message built and how failures are classified.
func (c *Connector) Deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	res, err := c.deliver(ctx, d)
	// A server that refuses a login may quote the line it refused.
	return connectors.HideSecret(res, err, c.secrets...)
}

func (c *Connector) deliver(ctx context.Context, d connectors.Delivery) (json.RawMessage, error) {
	m, err := c.build(d)
	if err != nil {
		return nil, connectors.Permanent(fmt.Errorf("deliver email: %w", err))
	}

	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrTimeout)
	defer cancel()

	client, conn, err := c.dial(ctx)
	if conn != nil {
		defer conn.Close() //nolint:errcheck // after QUIT, or after a failure: nothing to report
	}
	if err != nil {
		return nil, c.setupError(ctx, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, c.setupError(ctx, err) // nothing of the message was sent
	}

	res, err := c.send(ctx, client, m)
	if err != nil {
		return nil, err
	}
	_ = client.Quit() // the message is accepted; a failed goodbye changes nothing
	return connectors.MarshalResult(res), nil
}

// build checks the payload and turns it into a message. Its errors are the row's fault.
func (c *Connector) build(d connectors.Delivery) (*message, error) {
	if d.Key == "" {
		return nil, errors.New("the row has no idempotency key")
	}
	if problem := connectors.KeyHeaderProblem(d.Key); problem != "" {
		return nil, fmt.Errorf("the idempotency key %q cannot be sent: %s", d.Key, problem)
	}
	p, err := decodePayload(d.Payload)
	if err != nil {
		return nil, err
	}

	msg := gomail.NewMsg()
	m := &message{msg: msg, messageID: MessageID(d.Key, c.idDomain)}
	msg.FromMailAddress(c.from)
	for _, f := range []struct {
		name  string
		addrs Addresses
		set   func(...*mail.Address)
		rcpt  bool
	}{
		{"to", p.To, msg.ToMailAddress, true},
		{"cc", p.Cc, msg.CcMailAddress, true},
		{"bcc", p.Bcc, msg.BccMailAddress, true},
		{"reply_to", p.ReplyTo, msg.ReplyToMailAddress, false},
	} {
		if len(f.addrs) == 0 {
			continue
		}
		parsed := make([]*mail.Address, len(f.addrs))
		for i, s := range f.addrs {
			a, err := mail.ParseAddress(s)
			if err != nil {
				return nil, fmt.Errorf("payload: %q: %q is not an email address: %w", f.name, s, err)
			}
			parsed[i] = a
			if f.rcpt {
				m.rcpts = append(m.rcpts, a.Address)
			}
		}
		f.set(parsed...)
	}

	headers, err := checkHeaders(p.Headers)
	if err != nil {
		return nil, err
	}
	// Before the payload's headers, so that a row's own X-Mailer or User-Agent, which
	// nothing refuses, is sent rather than silently replaced.
	msg.SetUserAgent("outboxd")
	for canon, value := range headers {
		msg.SetGenHeader(gomail.Header(canon), value)
	}
	// Set after the payload's headers, so that nothing a row says can replace them.
	msg.SetGenHeader(gomail.HeaderMessageID, m.messageID)
	msg.SetGenHeader("Idempotency-Key", d.Key)
	msg.SetDateWithValue(c.now())
	if p.Subject != "" {
		msg.Subject(p.Subject)
	}
	switch {
	case p.Text != "" && p.HTML != "":
		msg.SetBodyString(gomail.TypeTextPlain, p.Text)
		msg.AddAlternativeString(gomail.TypeTextHTML, p.HTML) // multipart/alternative
	case p.Text != "":
		msg.SetBodyString(gomail.TypeTextPlain, p.Text)
	default:
		msg.SetBodyString(gomail.TypeTextHTML, p.HTML)
	}
	return m, nil
}

// decodePayload decodes a row's payload and checks what every transport needs: a "to"
// and a body. Its errors are the row's fault.
func decodePayload(raw json.RawMessage) (Payload, error) {
	var p Payload
	if err := connectors.DecodeObject(raw, &p); err != nil { // a misspelt "body" would send an empty mail
		return Payload{}, err
	}
	if len(p.To) == 0 {
		return Payload{}, errors.New(`payload: "to" is required`)
	}
	if p.Text == "" && p.HTML == "" {
		return Payload{}, errors.New(`payload: "text" or "html" is required`)
	}
	return p, nil
}

// dial connects, greets, upgrades with STARTTLS per the policy and authenticates. The
// returned conn is the raw connection, non-nil whenever one was opened (even when err is
// not nil), for the caller to close.
func (c *Connector) dial(ctx context.Context) (*smtp.Client, net.Conn, error) {
	var (
		mu   sync.Mutex
		conn net.Conn
	)
	opts := []gomail.Option{
		gomail.WithPort(c.port),
		gomail.WithTimeout(c.timeout),
		gomail.WithTLSPolicy(c.tlsPolicy),
		gomail.WithTLSConfig(c.tlsConfig),
		gomail.WithDialContextFunc(func(dialCtx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(dialCtx, network, c.addr)
			if err == nil && c.implicit {
				// SMTPS: the handshake first, bounded as the dial is. go-mail dials
				// through this function, so its own SSL option would not apply.
				tc := tls.Client(nc, c.tlsConfig)
				if err = tc.HandshakeContext(dialCtx); err != nil {
					_ = nc.Close()
					return nil, err
				}
				nc = tc
			}
			if err == nil {
				// Closing the connection is what interrupts a blocked read or write when
				// the attempt (ctx, not go-mail's dialCtx, which ends with the dial) is
				// cancelled or times out, from the greeting on: go-mail's deadlines bound
				// each step alone.
				context.AfterFunc(ctx, func() { _ = nc.Close() })
				mu.Lock()
				conn = nc
				mu.Unlock()
			}
			return nc, err
		}),
	}
	if c.username != "" {
		opts = append(opts,
			// The strongest mechanism the server offers. go-mail's PLAIN and LOGIN refuse
			// to send the password in clear, except to a loopback server.
			gomail.WithOpportunisticSMTPAuth(
				gomail.SMTPAuthSCRAMSHA256PLUS, gomail.SMTPAuthSCRAMSHA256,
				gomail.SMTPAuthSCRAMSHA1PLUS, gomail.SMTPAuthSCRAMSHA1,
				gomail.SMTPAuthCramMD5, gomail.SMTPAuthPlain, gomail.SMTPAuthLogin),
			gomail.WithUsername(c.username),
			gomail.WithPassword(c.password),
		)
	}
	// A client per attempt: go-mail's Client keeps per-connection state (the auth type
	// it settled on), and building one costs nothing next to a TCP handshake.
	mc, err := gomail.NewClient(c.host, opts...)
	if err != nil {
		return nil, nil, err
	}
	client, err := mc.DialToSMTPClientWithContext(ctx)
	mu.Lock()
	defer mu.Unlock()
	return client, conn, err
}

// setupError classifies a failure before the mail transaction began: nothing was sent,
// so the attempt had no effect. It is retried even when the server answered 5xx (a
// rejected greeting, failed authentication): that is about the server or this
// connector's configuration, not the row, and marking it permanent would send every row
// to dead while it lasts.
func (c *Connector) setupError(ctx context.Context, err error) error {
	return fmt.Errorf("smtp %s: connect: %w", c.addr, withCause(ctx, err))
}

// withCause names why ctx ended, when it did, next to err. go-mail also puts a deadline
// on the connection: the attempt's timeout (see dial), counted from after the dial and
// again after the greeting, so it passes just after ctx's. Against a server on loopback
// that is within microseconds, and it often strikes before ctx is seen to have ended: it
// is named as ctx's would be.
func withCause(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		cause = ErrTimeout
	}
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}

// send runs the mail transaction on client: MAIL, RCPT for each recipient, DATA.
func (c *Connector) send(ctx context.Context, client *smtp.Client, m *message) (Result, error) {
	if err := client.Mail(angle(c.from.Address)); err != nil {
		// MAIL FROM carries only the configured sender, nothing of the row: a refusal,
		// even 5xx (530 authentication required, a sender the server does not take), is
		// about the server or the configuration, and retried as a failed login is.
		return Result{}, fmt.Errorf("smtp %s: MAIL FROM: %w", c.addr, withCause(ctx, err))
	}
	var errs []error
	accepted, limited := 0, false
	for _, rcpt := range m.rcpts {
		if err := client.Rcpt(angle(rcpt)); err != nil {
			te, ok := errors.AsType[*textproto.Error](err)
			if !ok {
				// The connection failed. A server that refused earlier recipients may have
				// hung up with the last of them (421 closes it): those replies say why, and
				// a 5xx among them makes the row permanent.
				errs = append(errs, fmt.Errorf("%s: %w", rcpt, err))
				return Result{}, c.replyError(ctx, "RCPT TO", errors.Join(errs...))
			}
			// 452 with enhanced code 4.5.3 after recipients of this message were taken is
			// the server's limit on recipients per message (RFC 5321 section 4.5.3.1.10,
			// RFC 3463: "too many recipients"), which every retry of the same message meets.
			limited = limited || accepted > 0 && te.Code == 452 && strings.HasPrefix(te.Msg, "4.5.3")
			errs = append(errs, fmt.Errorf("%s: %w", rcpt, err))
			continue
		}
		accepted++
	}
	if len(errs) > 0 {
		// All or nothing: a message that reached only some recipients could not be
		// completed by a retry without duplicating it for the others.
		_ = client.Reset()
		if limited {
			return Result{}, connectors.Permanent(fmt.Errorf(
				"smtp %s: RCPT TO: the server took %d of the message's %d recipients and refused the rest as too many for one message (4.5.3), which every retry would meet; split the row into messages of fewer recipients: %w",
				c.addr, accepted, len(m.rcpts), errors.Join(errs...)))
		}
		return Result{}, c.replyError(ctx, "RCPT TO", errors.Join(errs...))
	}
	w, err := client.Data()
	if err != nil {
		return Result{}, c.replyError(ctx, "DATA", err)
	}
	dc, ok := w.(*smtp.DataCloser)
	if !ok {
		// Not reached: go-mail's Data returns one, and endData needs it. Checked before
		// the message is written, so that failing here sends nothing.
		return Result{}, fmt.Errorf("smtp %s: DATA: go-mail gave a %T, not an *smtp.DataCloser", c.addr, w)
	}
	if _, err := m.msg.WriteTo(w); err != nil {
		// The terminating "." was not sent, so the server cannot have accepted the message.
		return Result{}, fmt.Errorf("smtp %s: send message: %w", c.addr, withCause(ctx, err))
	}
	res := Result{MessageID: m.messageID, Accepted: m.rcpts}
	code, text, sent, err := endData(client, dc)
	if err != nil && !sent {
		// The write of the message's end failed, and no reply was there to read: the
		// final "." never left, so the server cannot have accepted the message.
		return Result{}, fmt.Errorf("smtp %s: end of message: the connection failed before the message's end was sent, so the server cannot have accepted it: %w",
			c.addr, withCause(ctx, err))
	}
	if err != nil {
		// The whole message went out and the reply never came: the server may have
		// queued it.
		return Result{}, connectors.Ambiguous(fmt.Errorf(
			"smtp %s: no reply after the message was sent; the server may have accepted it: %w",
			c.addr, withCause(ctx, err)))
	}
	// The first digit decides (RFC 5321 section 4.2.1): 2yz is a completion, so the
	// server took the message, and a retry would send it again; 4yz and 5yz are
	// refusals; anything else leaves unknown whether the server queued it.
	switch code / 100 {
	case 2:
		res.ServerReply = strings.TrimSpace(strconv.Itoa(code) + " " + text)
		return res, nil
	case 4, 5:
		return Result{}, c.replyError(ctx, "end of DATA", &textproto.Error{Code: code, Msg: text})
	}
	return Result{}, connectors.Ambiguous(fmt.Errorf(
		"smtp %s: end of DATA: a reply that neither accepts nor refuses the message; the server may have accepted it: %w",
		c.addr, &textproto.Error{Code: code, Msg: text}))
}

// endData sends the "." that ends the message and reads the server's reply, as
// go-mail's DataCloser.Close does, but with readReply instead of textproto's
// ReadResponse. That one refuses a reply that is a bare code, so a server's "250" to
// the message looked like a lost reply: the attempt was ambiguous, and the message,
// which the server had queued, went out again on every retry.
//
// sent is false when the write of the message's end failed and no reply could be read:
// the final "." did not leave (a write that fails leaves its last bytes unsent), so the
// server cannot have taken the message. err is then the write's error.
func endData(client *smtp.Client, dc *smtp.DataCloser) (code int, text string, sent bool, err error) {
	// As DataCloser.Close: a failed write leaves the reply to tell (a server that refused
	// the message early and closed the connection), but a broken connection has none to
	// read.
	werr := dc.WriteCloser.Close()
	code, text, err = readReply(&client.Text.Reader)
	if err != nil && werr != nil {
		return 0, "", false, werr
	}
	return code, text, true, err
}

// readReply reads one reply, of one line or several, as textproto's ReadResponse does,
// and also takes a line that is a bare code, without the space and text after it: RFC
// 5321 section 4.2 says servers should not send one and clients must accept it. It
// returns the code and the lines' texts joined by "\n".
func readReply(r *textproto.Reader) (int, string, error) {
	line, err := r.ReadLine()
	if err != nil {
		return 0, "", err
	}
	code, more, text, ok := parseReplyLine(line)
	if !ok {
		return 0, "", textproto.ProtocolError(fmt.Sprintf("malformed reply: %q", line))
	}
	texts := []string{text}
	for more {
		if line, err = r.ReadLine(); err != nil {
			return 0, "", err
		}
		next, nextMore, nextText, ok := parseReplyLine(line)
		if !ok || next != code {
			texts = append(texts, line) // kept whole, and the reply goes on, as in ReadResponse
			continue
		}
		more = nextMore
		texts = append(texts, nextText)
	}
	return code, strings.Join(texts, "\n"), nil
}

// parseReplyLine splits a reply line into its code, whether more lines follow ("250-"),
// and its text; ok is false when the line does not start with a code.
func parseReplyLine(line string) (code int, more bool, text string, ok bool) {
	if len(line) < 3 || len(line) > 3 && line[3] != ' ' && line[3] != '-' {
		return 0, false, "", false
	}
	for i := range 3 {
		if line[i] < '0' || line[i] > '9' {
			return 0, false, "", false
		}
	}
	code, _ = strconv.Atoi(line[:3])
	if code < 100 {
		return 0, false, "", false
	}
	if len(line) == 3 {
		return code, false, "", true
	}
	return code, line[3] == '-', line[4:], true
}

// replyError classifies a failed step of the transaction before the message was sent:
// 5xx replies are permanent, 4xx replies, 530 and broken connections are retried. The
// server's replies stay in the chain as *textproto.Error.
func (c *Connector) replyError(ctx context.Context, step string, err error) error {
	if permanentReply(err) {
		// The server's answer, without ctx's cause even when ctx ended after it came: the
		// relay takes an error that wraps it as the stop's doing, and would record this
		// refusal as an attempt that may have sent the message.
		return connectors.Permanent(fmt.Errorf("smtp %s: %s: %w", c.addr, step, err))
	}
	return fmt.Errorf("smtp %s: %s: %w", c.addr, step, withCause(ctx, err))
}

// permanentReply reports whether any reply in err's tree is 5xx, other than 530.
func permanentReply(err error) bool {
	switch e := err.(type) {
	case *textproto.Error:
		// 530 is "authentication required" (RFC 4954), which a server may answer to RCPT
		// or DATA as well as to MAIL FROM: it is about the configuration, not the row, and
		// is retried as a refused MAIL FROM is.
		return e.Code >= 500 && e.Code <= 599 && e.Code != 530
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if permanentReply(inner) {
				return true
			}
		}
		return false
	case interface{ Unwrap() error }:
		return permanentReply(e.Unwrap())
	default:
		return false
	}
}

func angle(addr string) string { return (&mail.Address{Address: addr}).String() }

// checkHeaders checks a payload's extra headers and returns them by canonical name. Two
// names that differ only in case name one header: keeping either value would drop the
// other silently, and which one depended on map order, so a retry could send another
// message (a different body, which Resend refuses as a reused key).
func checkHeaders(h map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(h))
	seen := make(map[string]string, len(h))
	for name, value := range h {
		canon, err := checkHeader(name, value)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[canon]; dup {
			a, b := min(name, other), max(name, other)
			return nil, fmt.Errorf("payload: headers %q and %q differ only in case, so they name one header; keep one", a, b)
		}
		seen[canon] = name
		out[canon] = value
	}
	return out, nil
}

// checkHeader checks one of a payload's extra headers and returns its canonical name.
func checkHeader(name, value string) (string, error) {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	if connectors.ReservedMailHeader(canon) {
		return "", fmt.Errorf("payload: header %q is set by the connector and cannot be overridden", name)
	}
	if !connectors.ValidMailHeaderName(name) {
		return "", fmt.Errorf("payload: header %q is not a valid header name", name)
	}
	if !connectors.ValidHeaderValue(value) {
		return "", fmt.Errorf("payload: header %q has control characters in its value", name)
	}
	return canon, nil
}
