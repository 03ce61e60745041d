package broker

import (
	"strings"
	"testing"
)

func TestRedacted(t *testing.T) {
	t.Parallel()
	got := Redacted("sentinel://:hunter2@h1:26379;sentinel://h2:26379")
	if strings.Contains(got, "hunter2") {
		t.Errorf("password leaked: %s", got)
	}
	if got := Redacted("redis://u:hunter2@h:1/0"); strings.Contains(got, "hunter2") {
		t.Errorf("password leaked: %s", got)
	}
}
