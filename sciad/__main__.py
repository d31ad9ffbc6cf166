from sciad._cli import main

main()
