from sciad.cli import main

main()
