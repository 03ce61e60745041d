package console

import (
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
	"github.com/beatd/beatd/status"
)

// TestChainAndTemplateShown: /status and the console's definition name a
// chained entry's workflow and say that its values are templated.
func TestChainAndTemplateShown(t *testing.T) {
	cfg, err := config.Parse("s.yaml", []byte(`entries:
  etl: {task: etl.fetch, every: 1h, args: ["{{ slot }}"], chain: [{task: etl.transform}], link_error: {task: etl.alert}}
  plain: {task: t, every: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	const workflow = "etl.fetch → etl.transform; link_error: etl.alert"
	now := time.Now()
	of := func(name string) status.Entry {
		return status.Of(status.Facts{Name: name, Entry: cfg.Entry(name)}, now)
	}
	if st := of("etl"); st.Workflow != workflow || !st.Templated || st.Task != "etl.fetch" {
		t.Errorf("status: workflow %q templated %v task %q", st.Workflow, st.Templated, st.Task)
	}
	if st := of("plain"); st.Workflow != "" || st.Templated {
		t.Errorf("plain entry: workflow %q templated %v", st.Workflow, st.Templated)
	}
	rows := map[string]string{}
	for _, r := range definition(cfg.Entry("etl"), of("etl"), "s.yaml") {
		rows[r.Key] = r.Value
	}
	if rows["task"] != workflow || !strings.Contains(rows["templated"], "render the slot") || rows["args"] != `["{{ slot }}"]` {
		t.Errorf("definition: %v", rows)
	}
}
