// Package catalog publishes the leader's running config to etcd, once per
// config load, so CLI commands anywhere can check entry names and compute
// next fire times without the schedule file.
//
// Layout under the cluster prefix:
//
//	catalog/header            JSON Header, written last
//	catalog/data/<sha>/<i>    the gzipped config file, in chunks
//
// A reader takes the header, then the chunks it names, and checks their
// digest, so a half-written catalog is never mistaken for a whole one.
// Chunks are rewritten only when the file's content changes; a new term
// with the same file rewrites the small header alone.
package catalog

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/election"
	"github.com/beatd/beatd/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ChunkSize keeps each write well under etcd's default 1.5 MiB request
// limit.
const ChunkSize = 1 << 20

// ErrNone means no leader has published a catalog under the prefix yet.
var ErrNone = errors.New("catalog: no leader has published its config yet")

// ErrNotLeader means a write was refused: the guard's term is over.
var ErrNotLeader = errors.New("catalog: not leader")

// Header describes the published config.
type Header struct {
	SHA256      string    `json:"sha256"` // of the uncompressed file
	Chunks      int       `json:"chunks"`
	File        string    `json:"file"` // the path on the leader
	Entries     int       `json:"entries"`
	LeaderID    string    `json:"leader_id"`
	Token       int64     `json:"token"`
	PublishedAt time.Time `json:"published_at"`
	// StatusURL is the leader's GET /status, written for older CLIs that
	// read it. This release finds the leader's HTTP in one place, its
	// registration (election.LeaderURL), which is fresh every few
	// seconds where this is written once a term.
	StatusURL string `json:"status_url,omitempty"`
	// RequireNotes: the leader runs with --require-notes, so the CLI
	// refuses a pause without --note before it writes to etcd.
	RequireNotes bool `json:"require_notes,omitempty"`
	// MinInterval is the leader's --min-interval (0: the default), so
	// the CLI reads the file with the floor the leader read it with.
	MinInterval time.Duration `json:"min_interval,omitempty"`
}

func headerKey(prefix string) string  { return keys.CatalogHeader(prefix) }
func dataPrefix(prefix string) string { return keys.CatalogData(prefix) }
func chunkKey(prefix, sha string, i int) string {
	return dataPrefix(prefix) + sha + "/" + strconv.Itoa(i)
}

// Payload is a config file ready to publish: its digest and its gzipped
// bytes. A leader keeps it, not the file, for the terms to come.
type Payload struct {
	SHA256 string
	gz     []byte
}

// Prepare digests and compresses a config file.
func Prepare(data []byte) Payload {
	sum := sha256.Sum256(data)
	var zb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&zb, gzip.DefaultCompression)
	_, _ = zw.Write(data)
	_ = zw.Close()
	return Payload{SHA256: hex.EncodeToString(sum[:]), gz: bytes.Clone(zb.Bytes())}
}

// Publish stores p and h under prefix, guarded by g. It writes the chunks
// only if etcd lacks them, and removes the chunks of older versions.
func Publish(ctx context.Context, cli *clientv3.Client, prefix string, g election.Fence, h Header, p Payload) error {
	h.SHA256 = p.SHA256
	z := p.gz
	h.Chunks = (len(z) + ChunkSize - 1) / ChunkSize
	guard := g.Held()
	commit := func(ops ...clientv3.Op) error {
		resp, err := cli.Txn(ctx).If(guard).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("catalog: write: %w", err)
		}
		if !resp.Succeeded {
			return ErrNotLeader
		}
		return nil
	}
	// Which versions does etcd hold? Keys only: the data can be large.
	resp, err := cli.Get(ctx, dataPrefix(prefix), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("catalog: list: %w", err)
	}
	have := map[string]bool{}
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	for i := 0; i < h.Chunks; i++ {
		k := chunkKey(prefix, h.SHA256, i)
		if have[k] {
			continue
		}
		if err := commit(clientv3.OpPut(k, string(z[i*ChunkSize:min(len(z), (i+1)*ChunkSize)]))); err != nil {
			return err
		}
	}
	hb, _ := json.Marshal(h)
	if err := commit(clientv3.OpPut(headerKey(prefix), string(hb))); err != nil {
		return err
	}
	var stale []clientv3.Op
	for k := range have {
		if !strings.HasPrefix(k, dataPrefix(prefix)+h.SHA256+"/") {
			stale = append(stale, clientv3.OpDelete(k))
		}
	}
	for len(stale) > 0 {
		n := min(len(stale), 64)
		if err := commit(stale[:n]...); err != nil {
			return err
		}
		stale = stale[n:]
	}
	return nil
}

// ReadHeader returns the published header, or ErrNone.
func ReadHeader(ctx context.Context, cli *clientv3.Client, prefix string) (Header, error) {
	var h Header
	resp, err := cli.Get(ctx, headerKey(prefix))
	if err != nil {
		return h, fmt.Errorf("catalog: read header: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return h, ErrNone
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &h); err != nil {
		return h, fmt.Errorf("catalog: header: %w", err)
	}
	return h, nil
}

// Read returns the published header and config file bytes, or ErrNone.
func Read(ctx context.Context, cli *clientv3.Client, prefix string) (Header, []byte, error) {
	h, err := ReadHeader(ctx, cli, prefix)
	if err != nil {
		return h, nil, err
	}
	resp, err := cli.Get(ctx, dataPrefix(prefix)+h.SHA256+"/", clientv3.WithPrefix())
	if err != nil {
		return h, nil, fmt.Errorf("catalog: read data: %w", err)
	}
	chunks := make([][]byte, h.Chunks)
	for _, kv := range resp.Kvs {
		i, err := strconv.Atoi(string(kv.Key[strings.LastIndexByte(string(kv.Key), '/')+1:]))
		if err == nil && i >= 0 && i < len(chunks) {
			chunks[i] = kv.Value
		}
	}
	for i, c := range chunks {
		if c == nil {
			return h, nil, fmt.Errorf("catalog: chunk %d of %d missing (a newer config is being published?)", i, h.Chunks)
		}
	}
	zr, err := gzip.NewReader(bytes.NewReader(bytes.Join(chunks, nil)))
	if err != nil {
		return h, nil, fmt.Errorf("catalog: data: %w", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return h, nil, fmt.Errorf("catalog: data: %w", err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != h.SHA256 {
		return h, nil, errors.New("catalog: data does not match its digest")
	}
	return h, data, nil
}

// Load returns the leader's config as published, parsed.
func Load(ctx context.Context, cli *clientv3.Client, prefix string) (*config.Config, Header, error) {
	h, data, err := Read(ctx, cli, prefix)
	if err != nil {
		return nil, h, err
	}
	cfg, err := config.ParseWith(h.File, data, config.Options{MinInterval: h.MinInterval})
	if err != nil {
		return nil, h, fmt.Errorf("catalog: the leader's config does not parse here: %w", err)
	}
	return cfg, h, nil
}
