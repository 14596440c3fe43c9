//go:build !unix

package fstool

// oNonblock is 0 where the flag does not exist.
const oNonblock = 0
