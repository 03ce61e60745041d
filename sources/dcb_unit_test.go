package sources

import (
	"net/url"
	"testing"
)

func TestSQLitePath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"sqlite:///srv/app/db.sqlite3", "/srv/app/db.sqlite3"},
		{"sqlite:////srv/app/db.sqlite3", "/srv/app/db.sqlite3"}, // dj-database-url, SQLAlchemy
		{"sqlite://host/db.sqlite3", ""},
		{"sqlite:///", ""},
		{"sqlite:relative.db", ""},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sqlitePath(u)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("sqlitePath(%s) = %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
}
