package approval_test

import (
	"encoding/json"
	"fmt"

	"github.com/toolgate/toolgate/approval"
)

func ExampleCanonicalArgs() {
	c, _ := approval.CanonicalArgs(json.RawMessage(` { "where": {"id": 7, "all": false}, "table": "tickets" } `))
	fmt.Println(string(c))
	_, err := approval.CanonicalArgs(json.RawMessage(`{"table":"tickets","table":"users"}`))
	fmt.Println(err)
	// Output:
	// {"table":"tickets","where":{"all":false,"id":7}}
	// approval: invalid arguments: duplicate object key "table"
}

func ExampleArgsDigest() {
	a, _ := approval.ArgsDigest(json.RawMessage(`{"b":1,"a":2}`))
	b, _ := approval.ArgsDigest(json.RawMessage(`{ "a": 2, "b": 1 }`))
	c, _ := approval.ArgsDigest(json.RawMessage(`{"a":2,"b":1.0}`))
	fmt.Println(a == b, a == c)
	// Output: true false
}
