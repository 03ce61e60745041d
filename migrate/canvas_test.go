package migrate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCeleryCanvasImport: a periodic chain (add_periodic_task with
// chain(...)) becomes the entry's task and chain; link and link_error
// options with signatures become the entry's link and link_error, each
// step with its args, kwargs, options and immutable; a group, which beatd
// does not send, is dropped with a warning and the entry kept.
func TestCeleryCanvasImport(t *testing.T) {
	cmd := exec.Command(helper.Python, helper.Script, "canvas_app:app")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("testdata", "celeryapp"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("celery_dump.py: %v", err)
	}
	src, err := Parse("dump.json", out)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(src, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  \"etl chain\":\n    task: \"etl.fetch\"\n    every: 5m\n    args: [1]\n" +
			`    chain: [{task: "etl.transform", options: {"queue": "etl"}}, {task: "etl.notify", kwargs: {"to": "ops"}, immutable: true}]`,
		"    options: {queue: \"math\"}\n" +
			`    link: [{task: "tasks.notify", kwargs: {"who": "ok"}, immutable: true}]` + "\n" +
			`    link_error: [{task: "tasks.alert", options: {"priority": 9}}]`,
	} {
		if !strings.Contains(res.YAML, want) {
			t.Errorf("YAML lacks\n%s\nin\n%s", want, res.YAML)
		}
	}
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, `entry "group-link": option link=`) {
		t.Errorf("warnings:\n%s", w)
	} else if !strings.Contains(w, "not imported: a group, not a task's signature") {
		t.Errorf("the group's warning does not say why:\n%s", w)
	}
	etl := res.Config.Entry("etl chain")
	if etl == nil || etl.Canvas() == nil || len(etl.Canvas().Chain) != 2 || !etl.Canvas().Chain[1].Immutable || etl.Canvas().Chain[0].Options.Keys[0] != "queue" {
		t.Fatalf("etl chain: %+v", etl)
	}
	cb := res.Config.Entry("with-callbacks")
	if c := cb.Canvas(); c == nil || len(c.Link) != 1 || c.Link[0].Task != "tasks.notify" || len(c.LinkError) != 1 || cb.Options.Queue != "math" {
		t.Fatalf("with-callbacks: %+v", cb.Canvas())
	}
	if g := res.Config.Entry("group-link"); g == nil || g.Canvas() != nil {
		t.Errorf("group-link: %+v, want kept without a link", g)
	}
}
