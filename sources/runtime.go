package sources

import (
	"context"

	"github.com/beatd/beatd/config"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// WithRuntimeEntries adds the entries API's entries, read from etcd, to
// file's config (which may be nil), for commands that read etcd directly
// (`beatd status`, trigger, pause and resume), from every one of the
// cluster's shards (reshard.ReadCount).
func WithRuntimeEntries(ctx context.Context, cli *clientv3.Client, prefix string, shards int, file *config.Config) (*config.Config, error) {
	docs, _, err := NewShardedEntries(cli, prefix, shards).List(ctx)
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return file, nil
	}
	m := New(Config{Validate: config.CheckEntry})
	if err := m.SetFile(file); err != nil {
		return nil, err
	}
	set := make(map[string][]byte, len(docs))
	for _, d := range docs {
		set[d.Name] = d.Data
	}
	if err := m.SetSource(API, set); err != nil {
		return nil, err
	}
	return m.Current(), nil
}
