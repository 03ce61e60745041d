package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beatd/beatd/auth"
	"github.com/beatd/beatd/internal/etcdflags"
	"github.com/beatd/beatd/internal/flagenv"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/store"
	"github.com/spf13/cobra"
)

// auditCommand is `beatd audit [ENTRY]`: who changed what, when and why.
func auditCommand(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	etcd := etcdflags.Flags{Prefix: keys.DefaultPrefix}
	var (
		server, tokenFile string
		serverCA          string
		limit             int
		asJSON            bool
		timeout           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "audit [ENTRY]",
		Short: "show who paused, resumed, triggered, backfilled, put or deleted entries, when and why",
		Long: fmt.Sprintf(`audit shows the audit trail, newest first: each change made through the CLI,
the API or the console, with the token's name, the time, the action, the
entry and the note. It reads etcd (--etcd-endpoints, --prefix), or a replica's
API with --server. etcd keeps the last %d records by default (run --audit-keep).
A change written straight to etcd (pause, resume or trigger without --server)
is recorded as actor "etcd": etcd's credentials are the schedule's.`, store.DefaultAuditKeep),
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(_ *cobra.Command, args []string) error {
			entry := ""
			if len(args) == 1 {
				entry = args[0]
			}
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			var recs []store.AuditRecord
			if server != "" {
				cl, err := newAPIClient(server, tokenFile, serverCA)
				if err != nil {
					fmt.Fprintln(stderr, "beatd audit:", termErr(err))
					return codeErr(exitFail)
				}
				q := url.Values{"limit": {strconv.Itoa(limit)}}
				if entry != "" {
					q.Set("entry", entry)
				}
				var out struct {
					Records []store.AuditRecord `json:"records"`
				}
				if err := cl.do(rctx, http.MethodGet, "/api/v1/audit?"+q.Encode(), nil, &out); err != nil {
					fmt.Fprintln(stderr, "beatd audit:", termErr(err))
					return codeErr(exitFail)
				}
				recs = out.Records
			} else {
				cli, err := etcd.Client()
				if err != nil {
					fmt.Fprintln(stderr, "beatd audit:", termErr(err))
					return codeErr(exitFail)
				}
				defer cli.Close()
				if recs, err = store.New(cli, etcd.KeyPrefix()).AuditLog(rctx, entry, limit); err != nil {
					fmt.Fprintln(stderr, "beatd audit:", termErr(etcd.Failure("read the audit trail", timeout, err)))
					return codeErr(exitFail)
				}
			}
			if asJSON {
				if recs == nil {
					recs = []store.AuditRecord{}
				}
				_ = json.NewEncoder(stdout).Encode(map[string]any{"records": recs})
				return nil
			}
			printAudit(stdout, recs)
			return nil
		},
	}
	fs := flagenv.New("audit", stderr)
	etcd.Register(fs)
	fs.StringVar(&server, "server", "", "read a replica's API at this URL instead of etcd")
	fs.StringVar(&tokenFile, "token-file", "", "with --server: file holding the bearer token (else BEATD_TOKEN, else BEATD_ADMIN_TOKEN)")
	fs.StringVar(&serverCA, "server-cacert", "", serverCACertHelp)
	fs.IntVar(&limit, "limit", 50, "the most records to show")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	fs.DurationVar(&timeout, "timeout", defaultTimeout, "deadline for reading the records")
	commandFlags(cmd, fs)
	return cmd
}

func printAudit(w io.Writer, recs []store.AuditRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTOR\tVIA\tACTION\tENTRY\tNOTE\tDETAIL")
	for _, r := range recs {
		entry := r.Entry
		if entry == "" && len(r.Entries) > 0 {
			entry = fmt.Sprintf("%d entries (%s…)", len(r.Entries), r.Entries[0])
			if len(r.Entries) == 1 {
				entry = r.Entries[0]
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.At.UTC().Format(time.RFC3339), dash(r.Actor), dash(r.Via), dash(r.Action),
			dash(entry), dash(oneLine(r.Note, 60)), dash(oneLine(r.Detail, 60)))
	}
	_ = tw.Flush()
}

// tokenLine is the tokens-file entry of a new token: one line of YAML to
// append under tokens: as it is (docs/access.md redirects it there), its
// note to a reader a comment.
func tokenLine(name string, r auth.Role, tok string) string {
	return fmt.Sprintf("  %s: {role: %s, sha256: %s}  # beatd token new: the token itself is on stdout, shown once\n", name, r, auth.Hash(tok))
}

// tokenCommand is `beatd token new NAME --role R | hash`.
func tokenCommand(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "token new NAME --role read|operate|admin | hash",
		Short: "make a named bearer token for --tokens-file, or hash one",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	var role string
	newCmd := &cobra.Command{
		Use:   "new NAME --role read|operate|admin",
		Short: "print a new random token, and the line that adds it to the tokens file",
		Long: `new prints a new random token on stdout (give it to its holder: it is not
stored anywhere) and on stderr one line, the tokens-file entry that lets it
in, which holds only the token's SHA-256. The line is YAML to append under
tokens: as it is:

  beatd token new alice --role operate 2>>tokens.yaml >alice.token

Roles: read (status, entries, audit), operate (also trigger, pause, resume,
backfill), admin (also put and delete entries).`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return usageError{c, err}
			}
			if err := auth.CheckName(args[0]); err != nil {
				return usageError{c, err}
			}
			tok := auth.NewToken()
			fmt.Fprintln(stdout, tok)
			fmt.Fprint(stderr, tokenLine(args[0], r, tok))
			return nil
		},
	}
	fs := flagenv.New("token new", stderr)
	fs.StringVar(&role, "role", "", "read, operate or admin")
	commandFlags(newCmd, fs)
	hashCmd := &cobra.Command{
		Use:   "hash",
		Short: "print the SHA-256 of a token read from stdin, as the tokens file holds it",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			b, err := io.ReadAll(io.LimitReader(stdin, 4096))
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, auth.Hash(strings.TrimSpace(string(b))))
			return nil
		},
	}
	root.AddCommand(newCmd, hashCmd)
	return root
}
