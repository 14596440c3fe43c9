// Package archtest keeps the package boundaries of docs/design.md ("6.
// Packages and the arrows between them") true: its test reads the import
// graph with go list and fails, naming the import edge and the file it is
// in, when a package imports what the design says it must not. The
// package has no code of its own; the rules are the table in
// archtest_test.go.
package archtest
