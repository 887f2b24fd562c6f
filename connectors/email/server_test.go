package email_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"
)

// testServer is a real SMTP server (go-smtp) on loopback that records every message it
// accepts. Recipients script its replies: a local part starting "rcpt451" or "rcpt550"
// is refused with that code, and a message with header "X-Test-Data-Reply: 451" (or
// another code) is refused at the end of DATA; one with a 2xx code there is accepted and
// answered with that code.
type testServer struct {
	addr string
	tls  *tls.Config // the client side: trusts the server's certificate, when it has one

	mu   sync.Mutex
	msgs []received
	drop map[string]int // Idempotency-Key -> messages to accept and then drop without reply
}

type serverOptions struct {
	// StartTLS makes the server offer STARTTLS with a self-signed certificate.
	StartTLS bool
	// ImplicitTLS makes the server speak TLS from the first byte (SMTPS), with a
	// self-signed certificate.
	ImplicitTLS bool
	// Username and Password, when set, make the server require AUTH PLAIN before MAIL.
	Username, Password string
	// AuthAtRcpt makes a server with Username take MAIL without AUTH and refuse each RCPT
	// with 530 until then, as some servers do (hMailServer).
	AuthAtRcpt bool
	// OnReset, when set, runs when the client abandons a transaction in progress (RSET
	// after MAIL), before the server replies.
	OnReset func()
	// MaxRecipients, when set, limits the recipients of one message, as Gmail (100),
	// Microsoft 365 and Postfix (smtpd_recipient_limit) do: a RCPT past it is answered
	// "452 4.5.3 Maximum limit of N recipients reached".
	MaxRecipients int
}

// received is one message the server accepted.
type received struct {
	From     string
	Rcpts    []string
	Header   mail.Header
	Body     []byte
	TLS      bool
	AuthUser string
}

func startServer(t *testing.T, opts serverOptions) *testServer {
	t.Helper()
	s, stop, err := listen(opts)
	require.NoError(t, err)
	t.Cleanup(stop)
	return s
}

// listen starts a server with opts; stop closes it and waits for it to return.
func listen(opts serverOptions) (*testServer, func(), error) {
	s := &testServer{drop: map[string]int{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{s: s, c: c, opts: opts}, nil
	}))
	srv.Domain = "localhost"
	srv.ErrorLog = log.New(io.Discard, "", 0) // the scripted drops would fill the output
	srv.AllowInsecureAuth = true              // loopback: PLAIN in clear is what a local relay does
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.MaxRecipients = opts.MaxRecipients
	var serverTLS *tls.Config
	if opts.StartTLS || opts.ImplicitTLS {
		var err error
		if serverTLS, s.tls, err = selfSigned(); err != nil {
			return nil, nil, err
		}
	}
	if opts.StartTLS {
		srv.TLSConfig = serverTLS
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	if opts.ImplicitTLS {
		l = tls.NewListener(l, serverTLS)
	}
	s.addr = l.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return s, func() {
		_ = srv.Close()
		_ = l.Close() // Close misses a listener that Serve has not registered yet
		<-done
	}, nil
}

// Effects counts the messages accepted with Idempotency-Key key.
func (s *testServer) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.msgs {
		if m.Header.Get("Idempotency-Key") == key {
			n++
		}
	}
	return n
}

// ByMessageID returns the messages accepted with Message-ID id.
func (s *testServer) ByMessageID(id string) []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []received
	for _, m := range s.msgs {
		if m.Header.Get("Message-Id") == id {
			out = append(out, m)
		}
	}
	return out
}

// Messages returns every message accepted.
func (s *testServer) Messages() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

// DropAfterData makes the server accept the next message with Idempotency-Key key, then
// close the connection instead of replying to it.
func (s *testServer) DropAfterData(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop[key]++
}

type session struct {
	s     *testServer
	c     *smtp.Conn
	opts  serverOptions
	user  string
	from  string
	rcpts []string
}

var _ smtp.AuthSession = (*session)(nil)

func (ss *session) AuthMechanisms() []string {
	if ss.opts.Username == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (ss *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(_, username, password string) error {
		if username != ss.opts.Username || password != ss.opts.Password {
			return smtp.ErrAuthFailed
		}
		ss.user = username
		return nil
	}), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if ss.opts.Username != "" && ss.user == "" && !ss.opts.AuthAtRcpt {
		return smtp.ErrAuthRequired
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if ss.opts.AuthAtRcpt && ss.user == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	for _, code := range []int{451, 550} {
		if strings.HasPrefix(to, "rcpt"+strconv.Itoa(code)) {
			return &smtp.SMTPError{
				Code:         code,
				EnhancedCode: smtp.EnhancedCode{code / 100, 1, 1},
				Message:      "scripted refusal of " + to,
			}
		}
	}
	ss.rcpts = append(ss.rcpts, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "unparsable message"}
	}
	var reply *smtp.SMTPError
	if v := msg.Header.Get("X-Test-Data-Reply"); v != "" {
		code, _ := strconv.Atoi(v)
		if code/100 != 2 {
			return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{code / 100, 0, 0}, Message: "scripted refusal of the message"}
		}
		// A positive completion reply other than 250: the message is taken (recorded
		// below), and answered with that code.
		reply = &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{2, 0, 0}, Message: "scripted acceptance of the message"}
	}
	body, _ := io.ReadAll(msg.Body)
	_, isTLS := ss.c.TLSConnectionState()
	rec := received{
		From: ss.from, Rcpts: append([]string(nil), ss.rcpts...), Header: msg.Header, Body: body,
		TLS: isTLS, AuthUser: ss.user,
	}

	ss.s.mu.Lock()
	ss.s.msgs = append(ss.s.msgs, rec)
	key := msg.Header.Get("Idempotency-Key")
	drop := ss.s.drop[key] > 0
	if drop {
		ss.s.drop[key]--
	}
	ss.s.mu.Unlock()

	if drop {
		// The message is queued (recorded); the reply never leaves. go-smtp then fails to
		// write its 250 on the closed connection and ends the session.
		_ = ss.c.Conn().Close()
	}
	if reply != nil {
		return reply
	}
	return nil
}

func (ss *session) Reset() {
	if ss.from != "" && ss.opts.OnReset != nil {
		ss.opts.OnReset()
	}
	ss.from, ss.rcpts = "", nil
}

func (ss *session) Logout() error { return nil }

// selfSigned returns a server config with a fresh certificate for 127.0.0.1 and a client
// config that trusts it.
func selfSigned() (*tls.Config, *tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "outboxd test SMTP"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
		MinVersion:   tls.VersionTLS12,
	}
	return server, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// refusedAddr returns a loopback address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
