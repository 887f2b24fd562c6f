package main

import (
	"encoding/json"
	goversion "go/version"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/config"
)

// TestDockerfileMatchesTheTree keeps the Dockerfile true for this tree, since no test
// builds the image: its Go can build this module, it builds this command statically and
// stamps the version this command reads, the variables it sets are ones outboxd reads
// and accepts, it exposes the port serve listens on, and it runs the binary it copied
// as a command outboxd has, as a numeric non-root user.
func TestDockerfileMatchesTheTree(t *testing.T) {
	t.Parallel()

	raw, err := os.ReadFile("../../Dockerfile")
	require.NoError(t, err)
	df := parseDockerfile(string(raw))

	// The golang image sets GOTOOLCHAIN=local, so a Go older than go.mod's go line
	// stops at go mod download ("go.mod requires go >= ..."); a tag without the patch
	// version (1.26) may be an older one cached on the building machine.
	mod, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	require.NotNil(t, goLine, "go.mod has no go line")
	from := df.all("FROM")
	require.NotEmpty(t, from)
	image := regexp.MustCompile(`^golang:(\d+\.\d+\.\d+)-\S+ AS build$`).FindStringSubmatch(from[0])
	require.NotNil(t, image, "the build stage must start FROM golang:<full Go version>-<os> AS build, got %q", from[0])
	require.True(t, goversion.Compare("go"+image[1], "go"+string(goLine[1])) >= 0,
		"the build stage's Go %s is older than go.mod's go line %s", image[1], goLine[1])

	var build string
	for _, run := range df.all("RUN") {
		if strings.Contains(run, "go build") {
			build = run
		}
	}
	require.Contains(t, build, "CGO_ENABLED=0 go build", "the binary must be static (CGO_ENABLED=0), tied to no C library of the final image")
	require.Contains(t, build, "-X main.version=${VERSION}", "the version is stamped into main.version")
	_ = version // the variable the stamp sets: renaming it fails to compile here
	out := regexp.MustCompile(`-o (\S+) \./cmd/outboxd$`).FindStringSubmatch(build)
	require.NotNil(t, out, "the build must write this command, ./cmd/outboxd, with -o, got %q", build)

	var binary string
	for _, c := range df.all("COPY") {
		if m := regexp.MustCompile(`^--from=build (\S+) (\S+)$`).FindStringSubmatch(c); m != nil {
			require.Equal(t, out[1], m[1], "the final stage copies what the build wrote")
			binary = m[2]
		}
	}
	require.NotEmpty(t, binary, "the final stage copies the binary from the build stage")

	var entrypoint, cmd []string
	require.NoError(t, json.Unmarshal([]byte(df.last("ENTRYPOINT")), &entrypoint), "ENTRYPOINT in exec form")
	require.NoError(t, json.Unmarshal([]byte(df.last("CMD")), &cmd), "CMD in exec form")
	require.Equal(t, []string{binary}, entrypoint, "the entrypoint is the binary copied")
	found, _, err := newRootCmd(&env{}).Find(cmd)
	require.NoError(t, err)
	require.Equal(t, cmd, strings.Fields(found.CommandPath())[1:], "CMD %q is not an outboxd command", cmd)

	user := strings.Split(df.last("USER"), ":")
	for _, id := range user {
		n, err := strconv.Atoi(id)
		require.NoError(t, err, "USER must be numeric, so that runAsNonRoot can verify it: %q", df.last("USER"))
		require.NotZero(t, n, "USER must not be root")
	}

	// The variables the image sets: outboxd reads each and accepts its value.
	environ := []string{"OUTBOX_DATABASE_URL=postgres://app@db/app", "OUTBOX_WEBHOOK_URL=http://hooks.example/outbox"}
	read := make(map[string]bool)
	for _, v := range config.Variables() {
		read[v.Name] = true
	}
	for _, e := range strings.Fields(strings.Join(df.all("ENV"), " ")) {
		name, _, ok := strings.Cut(e, "=")
		require.True(t, ok, "ENV in name=value form: %q", e)
		require.True(t, read[name], "the Dockerfile sets %s, which outboxd does not read", name)
		environ = append(environ, e)
	}
	cfg, err := config.Load(environ)
	require.NoError(t, err)
	_, port, err := net.SplitHostPort(cfg.HTTPAddr)
	require.NoError(t, err)
	require.Equal(t, port, strings.TrimSuffix(df.last("EXPOSE"), "/tcp"), "EXPOSE the port serve listens on (%s)", cfg.HTTPAddr)
}

// dockerfile is a Dockerfile's instructions, continuation lines joined, comments left out.
type dockerfile []struct{ op, args string }

func parseDockerfile(text string) dockerfile {
	var df dockerfile
	var line string
	for _, l := range strings.Split(text, "\n") {
		if trimmed := strings.TrimSpace(l); line == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if rest, ok := strings.CutSuffix(strings.TrimRight(l, " \t"), "\\"); ok {
			line += strings.TrimSpace(rest) + " "
			continue
		}
		line += strings.TrimSpace(l)
		op, args, _ := strings.Cut(line, " ")
		df = append(df, struct{ op, args string }{strings.ToUpper(op), strings.TrimSpace(args)})
		line = ""
	}
	return df
}

// all returns the arguments of every instruction op, in order.
func (df dockerfile) all(op string) []string {
	var out []string
	for _, in := range df {
		if in.op == op {
			out = append(out, in.args)
		}
	}
	return out
}

// last returns the arguments of the last instruction op, the one that takes effect.
func (df dockerfile) last(op string) string {
	all := df.all(op)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}
