package redis

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/beatd/beatd/broker"
	"github.com/beatd/beatd/celery"
	"github.com/beatd/beatd/testkit/testutil"
)

// TestCeleryWorkerRunsMessages publishes beatd messages and has an
// unmodified Celery 5.2.6 worker run them.
func TestCeleryWorkerRunsMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Celery worker")
	}
	rs := testutil.MustStartRedis(t)
	worker := testutil.MustStartCeleryWorker(t, rs, "celery,reports")
	ctx := context.Background()
	p := New(rs.Client(), Options{Cluster: "beatd/e2e", KeyPrefix: "beatd:{e2e}:"})
	tests := []struct {
		name       string
		yaml       string
		wantStatus string
		wantResult string
	}{
		{name: "args", yaml: "    {task: tasks.add, every: 1s, args: [2, 3]}", wantStatus: "SUCCESS", wantResult: `5`},
		{name: "unicode kwargs", yaml: "    {task: tasks.hello, every: 1s, kwargs: {who: \"Zoë ☃\"}}", wantStatus: "SUCCESS", wantResult: `"hello Zo\u00eb \u2603"`},
		{name: "other queue with priority", yaml: "    {task: tasks.add, every: 1s, args: [3, 4], options: {queue: reports, priority: 5}}", wantStatus: "SUCCESS", wantResult: `7`},
		{name: "priority 9", yaml: "    {task: tasks.add, every: 1s, args: [40, 2], options: {priority: 9}}", wantStatus: "SUCCESS", wantResult: `42`},
		{name: "custom header", yaml: "    {task: tasks.header, every: 1s, args: [x-team], options: {headers: {x-team: data}}}", wantStatus: "SUCCESS", wantResult: `"data"`},
		{name: "beat identity header", yaml: "    {task: tasks.header, every: 1s, args: [beat_entry]}", wantStatus: "SUCCESS", wantResult: `"e"`},
		{name: "expires later", yaml: "    {task: tasks.add, every: 1s, args: [1, 1], options: {expires: 300}}", wantStatus: "SUCCESS", wantResult: `2`},
		{name: "expired before the worker saw it", yaml: "    {task: tasks.add, every: 1s, args: [1, 1], options: {expires: 2020-01-01T00:00:00Z}}", wantStatus: "REVOKED"},
	}
	slot := time.Now().Truncate(time.Second)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := compileTest(t, tt.yaml)
			fires := []celery.Fire{{Task: task, Slot: slot.Add(time.Duration(i) * time.Second)}}
			res := make([]broker.Result, 1)
			if err := p.Publish(ctx, 1, fires, res); err != nil || res[0] != broker.ResultOK {
				t.Fatalf("publish: %v %v", res, err)
			}
			got := worker.WaitResult(t, string(fires[0].ID[:]), 30*time.Second)
			if got.Status != tt.wantStatus {
				t.Fatalf("status %s, want %s (result %s)", got.Status, tt.wantStatus, got.Result)
			}
			if tt.wantResult != "" {
				var g, w any
				_ = json.Unmarshal(got.Result, &g)
				_ = json.Unmarshal([]byte(tt.wantResult), &w)
				if g != w {
					t.Errorf("result %s, want %s", got.Result, tt.wantResult)
				}
			}
		})
	}
}
