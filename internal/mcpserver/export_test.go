package mcpserver

// ConnectInMemory is connectInMemory, for the package's external tests.
var ConnectInMemory = connectInMemory
