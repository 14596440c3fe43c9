package toolgate_test

import (
	"fmt"

	"github.com/toolgate/toolgate"
)

func ExampleParseArgs() {
	a, _ := toolgate.ParseArgs([]byte(` { "where": {"id": 7, "all": false}, "table": "tickets" } `))
	fmt.Println(string(a.Canonical))
	b, _ := toolgate.ParseArgs([]byte(`{"table":"tickets","where":{"all":false,"id":7}}`))
	fmt.Println(a.Digest == b.Digest)
	_, err := toolgate.ParseArgs([]byte(`{"table":"tickets","table":"users"}`))
	fmt.Println(err)
	_, err = toolgate.ParseArgs([]byte(`{"path":"notes.md","Path":".env"}`))
	fmt.Println(err != nil)
	// Output:
	// {"table":"tickets","where":{"all":false,"id":7}}
	// true
	// invalid arguments: duplicate object key "table"
	// true
}
