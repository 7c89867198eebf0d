// Command promql parses PromQL queries with Prometheus' own parser (the one promtool and the
// server use) and lists the metric names each query selects.
//
// Input (stdin): a JSON array of {"source": "...", "expr": "..."}. Output (stdout): a JSON
// array, in the same order, of {"source": "...", "metrics": ["..."], "error": "..."}:
// `error` is the parser's message when the query does not parse, and `metrics` the names
// of its vector and matrix selectors (a selector without a name, `{__name__=~"..."}`, is
// listed as its matcher). It exits 1 on unreadable input, 0 otherwise.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type query struct {
	Source string `json:"source"`
	Expr   string `json:"expr"`
}

type result struct {
	Source  string   `json:"source"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func names(expr parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == labels.MetricName {
						name = m.String()
					}
				}
			}
			seen[name] = true
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func main() {
	var queries []query
	if err := json.NewDecoder(os.Stdin).Decode(&queries); err != nil {
		fmt.Fprintln(os.Stderr, "promql: reading the queries:", err)
		os.Exit(1)
	}
	p := parser.NewParser(parser.Options{})
	results := make([]result, 0, len(queries))
	for _, q := range queries {
		r := result{Source: q.Source, Metrics: []string{}}
		expr, err := p.ParseExpr(q.Expr)
		if err != nil {
			r.Error = err.Error()
		} else {
			r.Metrics = names(expr)
		}
		results = append(results, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promql: writing the results:", err)
		os.Exit(1)
	}
}
