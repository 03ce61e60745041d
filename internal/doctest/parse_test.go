package doctest

import (
	"errors"
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	one := "1"
	tests := []struct {
		name string
		text string
		want []Block
		err  error
		cmds [][]Command
	}{
		{
			name: "fenced sh block, continuation and exit line",
			text: "intro\n\n```sh\n# exit 1\nbeatd validate bad.yaml\nbeatd run \\\n  --config x.yaml\n# stdout: 1\nredis-cli DEL k\n```\n",
			want: []Block{{File: "d.md", Line: 3, Info: "sh",
				Lines: []string{"# exit 1", "beatd validate bad.yaml", "beatd run \\", "  --config x.yaml", "# stdout: 1", "redis-cli DEL k"}}},
			cmds: [][]Command{{{Line: 5, Text: "beatd validate bad.yaml", Exit: 1}, {Line: 6, Text: "beatd run  --config x.yaml"},
				{Line: 9, Text: "redis-cli DEL k", Stdout: &one}}},
		},
		{
			name: "illustrative marker",
			text: "```console\n# illustrative: needs a Kubernetes cluster\n$ kubectl apply -f deploy/\ndeployment created\n```\n",
			want: []Block{{File: "d.md", Line: 1, Info: "console", Illustrative: "needs a Kubernetes cluster",
				Lines: []string{"# illustrative: needs a Kubernetes cluster", "$ kubectl apply -f deploy/", "deployment created"}}},
			cmds: [][]Command{{{Line: 3, Text: "kubectl apply -f deploy/"}}},
		},
		{
			name: "illustrative marker without a reason",
			text: "```sh\n# illustrative:\nmake demo\n```\n",
			err:  ErrNoReason,
		},
		{
			name: "indented block after a blank line, not under a list item",
			text: "Run:\n\n    make demo\n    make test\n\n- item\n\n      not a block\n",
			want: []Block{{File: "d.md", Line: 3, Indented: true, Lines: []string{"make demo", "make test"}}},
			cmds: [][]Command{{{Line: 4, Text: "make demo"}, {Line: 5, Text: "make test"}}},
		},
		{
			name: "yaml block is not a shell block",
			text: "```yaml\na: 1\n```\n",
			want: []Block{{File: "d.md", Line: 1, Info: "yaml", Lines: []string{"a: 1"}}},
			cmds: [][]Command{{{Line: 2, Text: "a: 1"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("d.md", tt.text)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("blocks\n%#v\nwant\n%#v", got, tt.want)
			}
			for i, b := range got {
				cmds, err := b.Commands()
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(cmds, tt.cmds[i]) {
					t.Errorf("commands of block %d\n%#v\nwant\n%#v", i, cmds, tt.cmds[i])
				}
			}
		})
	}
}
