//go:build !linux

package main

// volatileStorage cannot tell the file system elsewhere than on Linux: "".
func volatileStorage(string) string { return "" }
