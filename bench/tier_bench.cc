// Placeholder; the real benchmark follows.
int main() { return 0; }
