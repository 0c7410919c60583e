from .runtime import main

main()
